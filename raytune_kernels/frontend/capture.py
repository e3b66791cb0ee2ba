"""Capture an nn.Module with example inputs into a Graph with static shapes.

torch.fx symbolic tracing is tried first (fast, keeps module paths); where it cannot trace
(control flow on shapes), torch.export is used, which specialises shapes to the example
inputs. Control flow on tensor values and ops whose output shape depends on values are
refused with DynamicShapeError. Each fx/aten node is run on the example values as it is
translated, so every shape and shape expression (x.size(0), ...) is concrete.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
import torch.fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from raytune_kernels.frontend import ops
from raytune_kernels.errors import CaptureError, DynamicShapeError
from raytune_kernels.frontend.ops import Builder, Ctx, T
from raytune_kernels.frontend.graph import Graph
from raytune_kernels.frontend.passes import fold_affine, prune_params


def capture(model: nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor) -> Graph:
    """Capture `model` (put in eval mode) called on `example_inputs` into a Graph."""
    inputs = _check_inputs(example_inputs)
    model.eval()
    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception:  # control flow on shapes, or a module fx cannot trace: export may
        gm = _export(model, inputs)
    with torch.no_grad():
        graph = _Walker(gm, inputs).run()
    return prune_params(fold_affine(graph))


def _check_inputs(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) \
        else tuple(example_inputs)
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise CaptureError(f"example input {i} is a {type(x).__name__}, not a tensor")
        if x.dtype != torch.float32:
            raise CaptureError(f"example input {i} has dtype {x.dtype}; only float32 "
                               "networks are supported")
    return inputs


def _export(model: nn.Module, inputs: tuple) -> torch.fx.GraphModule:
    try:
        return torch.export.export(model, inputs, strict=False).module()
    except Exception as exc:
        text = str(exc)
        if "data-dependent" in text or "data dependent" in text:
            raise DynamicShapeError("control flow or a shape depends on tensor values",
                                    type(model).__name__, text.splitlines()[0]) from None
        raise CaptureError(f"neither torch.fx nor torch.export could capture "
                           f"{type(model).__name__}: {text.splitlines()[0]}") from exc


def _layer_of(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    stack = [v for v in (node.meta.get("nn_module_stack") or {}).values()
             if isinstance(v, tuple) and v[0]]
    if not stack:
        return node.name
    path, kind = stack[-1][0], str(stack[-1][1])
    if "torch.nn.modules." in kind:  # an exported call inside a torch.nn leaf module
        return path
    # a functional op is named after its enclosing module and its own node name
    return f"{path}.{node.name}"


def _what(node: torch.fx.Node, module: nn.Module | None) -> str:
    if module is not None:
        return type(module).__name__
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        return schema.name
    return getattr(node.target, "__name__", str(node.target))


class _Walker:
    """Runs a traced GraphModule node by node, translating tensor ops into Graph nodes."""

    def __init__(self, gm: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...]):
        self.gm, self.inputs, self.b = gm, list(inputs), Builder()
        self.env: dict[str, Any] = {}
        self.graph_inputs: list[tuple[str, tuple[int, ...]]] = []

    def run(self) -> Graph:
        outputs: tuple[str, ...] = ()
        for node in self.gm.graph.nodes:
            if node.op == "output":
                outputs = self._outputs(node)
            else:
                self.env[node.name] = self._visit(node)
        return Graph(tuple(self.graph_inputs), tuple(self.b.nodes), outputs, self.b.params)

    def _outputs(self, node: torch.fx.Node) -> tuple[str, ...]:
        leaves, _ = pytree.tree_flatten(self._args(node.args[0]))
        for leaf in leaves:
            if not isinstance(leaf, T):
                raise CaptureError(f"the model returns a {type(leaf).__name__}; outputs "
                                   "must be tensors")
        return tuple(leaf.ref for leaf in leaves)

    def _args(self, a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: self.env[n.name])

    def _visit(self, node: torch.fx.Node) -> Any:
        if node.op == "placeholder":
            return self._placeholder(node)
        if node.op == "get_attr":
            return self._get_attr(node)
        module = self.gm.get_submodule(node.target) if node.op == "call_module" else None
        if module is not None and str(node.target).startswith("_guards_fn"):
            return None  # torch.export's shape guards: our shapes are static already
        ctx = Ctx(_layer_of(node), node.name, _what(node, module))
        args, kwargs = self._args(node.args), self._args(node.kwargs)
        if module is not None:
            return self._module(module, node, args, ctx)
        return self._call(node, args, kwargs, ctx)

    def _placeholder(self, node: torch.fx.Node) -> T:
        if not self.inputs:
            raise CaptureError(f"model input '{node.name}' has no example input")
        x = self.inputs.pop(0)
        name = self.b.unique(node.name)
        self.graph_inputs.append((name, tuple(x.shape)))
        return T(name, x)

    def _get_attr(self, node: torch.fx.Node) -> Any:
        value = self.gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        if isinstance(value, torch.Tensor):
            return self.b.param(str(node.target), value)
        return value

    def _call(self, node: torch.fx.Node, args: tuple, kwargs: dict, ctx: Ctx) -> Any:
        ops.check_static(node.target, ctx)
        concrete = lambda v: v.value if isinstance(v, T) else v  # noqa: E731
        cargs = pytree.tree_map(concrete, args)
        ckwargs = pytree.tree_map(concrete, kwargs)
        if node.op == "call_method":
            out = getattr(cargs[0], node.target)(*cargs[1:], **ckwargs)
        else:
            if node.target is operator.getitem and isinstance(cargs[0], torch.Tensor):
                return self._tensor_getitem(node, args, cargs, ctx)
            out = node.target(*cargs, **ckwargs)
        if not isinstance(out, torch.Tensor):
            if _holds_tensor(out) and node.target is not operator.getitem:
                raise ctx.unsupported("an op that returns several tensors")
            return out  # a shape expression such as x.size(0): a constant from here on
        entry = ops.lookup(node.target)
        if entry is None:
            raise ctx.unsupported()
        stub, handler = entry
        try:
            bound = ops.bind(stub, args, kwargs)
        except TypeError as exc:
            raise ctx.unsupported(f"unexpected arguments ({exc})") from None
        return handler(self.b, bound, out, ctx)

    def _tensor_getitem(self, node, args, cargs, ctx: Ctx) -> Any:
        index = cargs[1]
        leaves, _ = pytree.tree_flatten(index)
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in leaves):
            raise DynamicShapeError("boolean mask indexing", ctx.layer)
        raise ctx.unsupported("tensor indexing/slicing")

    def _module(self, module: nn.Module, node, args: tuple, ctx: Ctx) -> Any:
        handler = _MODULES.get(type(module))
        if handler is None:
            raise ctx.unsupported("a module type the frontend does not know")
        if len(args) != 1 or not isinstance(args[0], T):
            raise ctx.unsupported("a module called with other than one tensor")
        x = args[0]
        out = module(x.value)
        return handler(self.b, module, x, out, ctx)


def _holds_tensor(v: Any) -> bool:
    return any(isinstance(x, torch.Tensor) for x in pytree.tree_flatten(v)[0])


# ---- nn.Module leaves (torch.fx keeps torch.nn modules as call_module nodes) ----

def _mparam(b: Builder, ctx: Ctx, module: nn.Module, attr: str) -> T | None:
    value = getattr(module, attr, None)
    return None if value is None else b.param(f"{ctx.layer}.{attr}", value)


def m_conv(b, m: nn.Conv2d, x, out, ctx):
    if m.padding_mode != "zeros":
        raise ctx.unsupported(f"padding_mode={m.padding_mode!r}")
    a = {"input": x, "weight": _mparam(b, ctx, m, "weight"), "bias": _mparam(b, ctx, m, "bias"),
         "stride": m.stride, "padding": m.padding, "dilation": m.dilation, "groups": m.groups}
    return ops.h_conv2d(b, a, out, ctx)


def m_linear(b, m: nn.Linear, x, out, ctx):
    a = {"input": x, "weight": _mparam(b, ctx, m, "weight"), "bias": _mparam(b, ctx, m, "bias")}
    return ops.h_dense(b, a, out, ctx)


def m_bn(b, m: nn.modules.batchnorm._BatchNorm, x, out, ctx):
    a = {"input": x, "running_mean": m.running_mean, "running_var": m.running_var,
         "weight": m.weight, "bias": m.bias, "training": m.training, "eps": m.eps}
    if isinstance(a["weight"], torch.Tensor):
        a["weight"], a["bias"] = m.weight.detach(), m.bias.detach()
    return ops.h_batch_norm(b, a, out, ctx)


def _m_unary(op: str):
    return lambda b, m, x, out, ctx: ops.unary(op)(b, {"input": x}, out, ctx)


def m_gelu(b, m: nn.GELU, x, out, ctx):
    return ops.h_gelu(b, {"input": x, "approximate": m.approximate}, out, ctx)


def m_hardtanh(b, m: nn.Hardtanh, x, out, ctx):
    return ops.h_hardtanh(b, {"input": x, "min_val": m.min_val, "max_val": m.max_val}, out, ctx)


def m_max_pool(b, m: nn.MaxPool2d, x, out, ctx):
    a = {"input": x, "kernel_size": m.kernel_size, "stride": m.stride, "padding": m.padding,
         "dilation": m.dilation, "ceil_mode": m.ceil_mode, "return_indices": m.return_indices}
    return ops.h_max_pool(b, a, out, ctx)


def m_avg_pool(b, m: nn.AvgPool2d, x, out, ctx):
    a = {"input": x, "kernel_size": m.kernel_size, "stride": m.stride, "padding": m.padding,
         "ceil_mode": m.ceil_mode, "count_include_pad": m.count_include_pad,
         "divisor_override": m.divisor_override}
    return ops.h_avg_pool(b, a, out, ctx)


def m_softmax(b, m: nn.Softmax, x, out, ctx):
    return ops.h_softmax(b, {"input": x, "dim": m.dim}, out, ctx)


def m_layer_norm(b, m: nn.LayerNorm, x, out, ctx):
    a = {"input": x, "normalized_shape": m.normalized_shape, "eps": m.eps,
         "weight": _mparam(b, ctx, m, "weight"), "bias": _mparam(b, ctx, m, "bias")}
    return ops.h_layer_norm(b, a, out, ctx)


_MODULES = {
    nn.Conv2d: m_conv, nn.Linear: m_linear,
    nn.BatchNorm1d: m_bn, nn.BatchNorm2d: m_bn,
    nn.ReLU: _m_unary("relu"), nn.ReLU6: _m_unary("relu6"), nn.Sigmoid: _m_unary("sigmoid"),
    nn.SiLU: _m_unary("silu"), nn.Tanh: _m_unary("tanh"), nn.GELU: m_gelu,
    nn.Hardtanh: m_hardtanh,
    nn.MaxPool2d: m_max_pool, nn.AvgPool2d: m_avg_pool,
    nn.AdaptiveAvgPool2d: lambda b, m, x, out, ctx: ops.h_adaptive_avg(
        b, {"input": x, "output_size": m.output_size}, out, ctx),
    nn.Flatten: lambda b, m, x, out, ctx: ops.h_reshape(b, {"input": x}, out, ctx),
    nn.Unflatten: lambda b, m, x, out, ctx: ops.h_reshape(b, {"input": x}, out, ctx),
    nn.Softmax: m_softmax, nn.LayerNorm: m_layer_norm,
    nn.Dropout: lambda b, m, x, out, ctx: ops.h_alias(b, {"input": x}, out, ctx),
    nn.Identity: lambda b, m, x, out, ctx: ops.h_alias(b, {"input": x}, out, ctx),
}
