"""Capture an nn.Module with example inputs into a Graph with static shapes.

torch.fx symbolic tracing is tried first (fast, keeps module paths); where it cannot trace
(control flow on shapes), torch.export is used, which specialises shapes to the example
inputs. Control flow on tensor values and ops whose output shape depends on values are
refused with DynamicShapeError. Each fx/aten node is run on the example values as it is
translated, so every shape and shape expression (x.size(0), ...) is concrete, and a value
computed from constants alone (an index buffer, a mask built with torch.arange) is folded
into a constant.

A call with no node of its own becomes a PyTorch island (frontend/island.py) with one
warning that names each; strict=True refuses it instead, naming the op and its layer.

A Hugging Face decoder returns its KV cache (a DynamicCache) beside its logits, which
neither torch.fx nor torch.export carries out of a graph: capture turns the cache off
(config.use_cache = False, kept after the capture like eval mode), so the model and the
compiled network both return the tensors alone.
"""
from __future__ import annotations

import inspect
import operator
import warnings
from typing import Any, Sequence

import torch
import torch.fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from raytune_kernels.frontend import ops
from raytune_kernels.frontend.activations import MODULES as ACTIVATION_MODULES
from raytune_kernels.errors import CaptureError, DynamicShapeError, UnsupportedOpError
from raytune_kernels.frontend.builder import Builder, Ctx, T, bind
from raytune_kernels.frontend.graph import Graph
from raytune_kernels.frontend.inline import autocast_off, export_call, inlinable
from raytune_kernels.frontend.island import ISLAND, Island, MethodCall, island_of
from raytune_kernels.frontend.conv1d import conv1d_module_handler, lift_unit_axis
from raytune_kernels.frontend.passes import (compose_permutes, fold_affine, pad_channels,
                                             prune_params)


def capture(model: nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor,
            strict: bool = False) -> Graph:
    """Capture `model` (put in eval mode) called on `example_inputs` into a Graph. Calls
    without a node of their own become PyTorch islands, with one warning listing them;
    with `strict`, the first such call is refused (UnsupportedOpError)."""
    inputs = _check_inputs(example_inputs)
    model.eval()
    _no_cache(model)
    try:
        gm = torch.fx.symbolic_trace(model, concrete_args=_left_out(model, len(inputs)))
    except Exception:  # control flow on shapes, or a module fx cannot trace: export may
        gm = _export(model, inputs)
    with torch.no_grad():
        graph = _Walker(gm, inputs, strict).run()
    graph = prune_params(pad_channels(fold_affine(compose_permutes(lift_unit_axis(graph)))))
    islands = [n for n in graph.nodes if n.op == ISLAND]
    if islands:
        named = dict.fromkeys(f"{n.attr('what')} in '{n.layer}'" for n in islands)
        warnings.warn(f"{len(islands)} op(s) run in PyTorch, no kernel of ours yet "
                      f"(strict=True refuses them): " + "; ".join(list(named)[:12])
                      + ("; ..." if len(named) > 12 else ""), stacklevel=2)
    return graph


def _no_cache(model: nn.Module) -> None:
    """Turn off the KV cache of every Hugging Face config in `model` (see the module
    docstring): a forward then returns no cache object."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", False) is True:
            config.use_cache = False


def _left_out(model: nn.Module, given: int) -> dict[str, Any] | None:
    """The forward's optional parameters after the example inputs (attention_mask=None),
    traced at their defaults; None when there are none."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())[given:]
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    left = {p.name: p.default for p in params
            if p.kind in kinds and p.default is not inspect.Parameter.empty}
    return left or None


def _check_inputs(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) \
        else tuple(example_inputs)
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise CaptureError(f"example input {i} is a {type(x).__name__}, not a tensor")
        if x.is_floating_point() and x.dtype != torch.float32:
            raise CaptureError(f"example input {i} has dtype {x.dtype}; only float32 "
                               "networks are supported")
        if x.is_complex():
            raise CaptureError(f"example input {i} is complex ({x.dtype})")
    return inputs


def _export(model: nn.Module, inputs: tuple) -> torch.fx.GraphModule:
    try:
        return torch.export.export(model, inputs, strict=False).module()
    except Exception as exc:
        text = str(exc)
        first = next((line for line in text.splitlines() if line.strip()), "")
        # a bare `assert` or `raise X()` in the model has no message: name the exception
        first = f"{type(exc).__name__}: {first}" if first else f"{type(exc).__name__} " \
            "(with no message) raised by the model's forward on the example inputs"
        if "data-dependent" in text or "data dependent" in text:
            raise DynamicShapeError("control flow or a shape depends on tensor values",
                                    type(model).__name__, first) from None
        raise CaptureError(f"neither torch.fx nor torch.export could capture "
                           f"{type(model).__name__}: {first}") from exc


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

    def __init__(self, gm: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...],
                 strict: bool = False, inside: "tuple[Builder, str] | None" = None):
        """`inside` (builder, layer) walks a call being inlined (frontend/inline.py): its
        inputs are graph values of the enclosing walk, its nodes join that builder, and
        an op inside without a handler becomes an island without a second inlining."""
        self.gm, self.inputs, self.strict = gm, list(inputs), strict
        self.b = inside[0] if inside else Builder()
        self.inside = inside[1] if inside else None
        self.env: dict[str, Any] = {}
        self.graph_inputs: list[tuple[str, tuple[int, ...]]] = []
        self.lifted: dict[int, tuple[torch.Tensor, T]] = {}  # id(constant) -> its param
        self.unexportable: set = set()  # calls torch.export failed on (frontend/inline.py)

    def run(self) -> Graph:
        outputs: tuple[str, ...] = ()
        for node in self.gm.graph.nodes:
            if node.op == "output":
                outputs = self._outputs(node)
            else:
                self.env[node.name] = self._visit(node)
        return Graph(tuple(self.graph_inputs), tuple(self.b.nodes), outputs, self.b.params)

    def run_inside(self) -> list[Any]:
        """Walk an inlined call; its flattened results (graph values or constants)."""
        for node in self.gm.graph.nodes:
            if node.op == "output":
                return pytree.tree_flatten(self._args(node.args[0]))[0]
            self.env[node.name] = self._visit(node)
        raise CaptureError("an exported graph without an output")

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
        layer = self.inside if self.inside is not None else _layer_of(node)
        ctx = Ctx(layer, node.name, _what(node, module))
        args, kwargs = self._args(node.args), self._args(node.kwargs)
        if module is not None:
            return self._module(module, node, args, kwargs, ctx)
        return self._call(node, args, kwargs, ctx)

    def _placeholder(self, node: torch.fx.Node) -> Any:
        if self.inside is not None:  # an inlined call's input: a value of the enclosing walk
            return self.inputs.pop(0)
        if not self.inputs:
            if node.args:  # an optional input left out (attn_mask=None): its default
                return node.args[0]
            raise CaptureError(f"model input '{node.name}' has no example input")
        x = self.inputs.pop(0)
        name = self.b.unique(node.name)
        self.graph_inputs.append((name, tuple(x.shape)))
        return T(name, x)

    def _get_attr(self, node: torch.fx.Node) -> Any:
        value = self.gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            name = str(node.target) if self.inside is None else \
                f"{self.inside}.{str(node.target).removeprefix('inner.')}"
            return self.b.param(name, value)
        return value  # an integer or bool buffer (an index table): a constant

    def _call(self, node: torch.fx.Node, args: tuple, kwargs: dict, ctx: Ctx) -> Any:
        ops.check_static(node.target, ctx)
        if node.target is operator.getitem and isinstance(args[0], (tuple, list, dict)):
            return args[0][args[1]]  # one output of a call that returned several
        region = autocast_off(node.target, args)
        if region is not None:  # a block with autocast off: its ops, walked in place
            return tuple(_Walker(region[0], region[1], self.strict,
                                 (self.b, ctx.layer)).run_inside())
        concrete = lambda v: v.value if isinstance(v, T) else v  # noqa: E731
        cargs = pytree.tree_map(concrete, args)
        ckwargs = pytree.tree_map(concrete, kwargs)
        call = MethodCall(node.target) if node.op == "call_method" else node.target
        if node.target is operator.getitem and isinstance(cargs[0], torch.Tensor):
            _check_index(args[1], ctx)
        out = call(*cargs, **ckwargs)
        if not self._holds_value((args, kwargs)) or ops.shape_only(node.target):
            return self._constant(out, ctx)
        args, kwargs = self._lift((args, kwargs))
        if not isinstance(out, torch.Tensor):
            if _holds_tensor(out):  # several outputs (chunk, split, unbind, ...)
                split = ops.lookup_split(node.target)
                if split is not None and isinstance(out, (tuple, list)):
                    try:
                        return split(self.b, bind(ops.SPLIT_STUBS[split], args, kwargs),
                                     list(out), ctx)
                    except (UnsupportedOpError, TypeError):
                        pass
                return self._islands(call, args, kwargs, out, ctx,
                                     ctx.unsupported("an op that returns several tensors"))
            return out  # a shape expression such as x.size(0): a constant from here on
        entry = ops.lookup(node.target)
        if entry is None:
            return self._islands(call, args, kwargs, out, ctx, ctx.unsupported())
        stub, handler = entry
        try:
            bound = bind(stub, args, kwargs)
        except TypeError as exc:
            return self._islands(call, args, kwargs, out, ctx,
                                 ctx.unsupported(f"unexpected arguments ({exc})"))
        try:
            return handler(self.b, bound, out, ctx)
        except UnsupportedOpError as exc:
            return self._islands(call, args, kwargs, out, ctx, exc)

    def _module(self, module: nn.Module, node, args: tuple, kwargs: dict, ctx: Ctx) -> Any:
        handler = _MODULES.get(type(module))
        concrete = lambda v: v.value if isinstance(v, T) else v  # noqa: E731
        out = module(*pytree.tree_map(concrete, args), **pytree.tree_map(concrete, kwargs))
        if not self._holds_value((args, kwargs)):
            return self._constant(out, ctx)
        args, kwargs = self._lift((args, kwargs))
        if handler is None:
            return self._islands(module, args, kwargs, out, ctx, ctx.unsupported(
                "a module type the frontend does not know"))
        if len(args) != 1 or kwargs or not isinstance(args[0], T) \
                or not isinstance(out, torch.Tensor):
            return self._islands(module, args, kwargs, out, ctx, ctx.unsupported(
                "a module called with other than one tensor"))
        try:
            return handler(self.b, module, args[0], out, ctx)
        except UnsupportedOpError as exc:
            return self._islands(module, args, kwargs, out, ctx, exc)

    def _holds_value(self, v: Any) -> bool:
        """Whether a graph value computed at run time (not a parameter, not a constant) is
        among the leaves of `v`."""
        return any(isinstance(x, T) and x.ref not in self.b.params
                   for x in pytree.tree_flatten(v)[0])

    def _constant(self, out: Any, ctx: Ctx) -> Any:
        """A result computed from parameters and constants alone (a class token expanded,
        a bias table gathered by its index buffer, a mask filled in place), folded at
        capture. It stays a plain tensor, so later in-place writes reach it, until an op
        on run-time values reads it (`_lift`)."""
        return out

    def _lift(self, v: Any) -> Any:
        """`v` with each float32 constant tensor among its leaves made a parameter, once
        per tensor (a parameter is a graph value an op on run-time values can read)."""
        def lift(leaf: Any) -> Any:
            if not isinstance(leaf, torch.Tensor) or leaf.dtype != torch.float32:
                return leaf
            if id(leaf) not in self.lifted:
                hint = f"{self.inside or 'folded'}.folded"
                self.lifted[id(leaf)] = (leaf, self.b.param(self.b.unique(hint), leaf))
            return self.lifted[id(leaf)][1]
        return pytree.tree_map(lift, v)

    def _islands(self, call, args: tuple, kwargs: dict, out: Any, ctx: Ctx,
                 problem: UnsupportedOpError) -> Any:
        """`call` as PyTorch island nodes, one per tensor it returns (same structure as
        `out`); with `strict`, the problem is raised instead."""
        island, inputs = island_of(ctx.what, call, args, kwargs,
                                   lambda v: isinstance(v, T), lambda v: v.value)
        if self.inside is None and inlinable(call):
            inlined = self._inline(island, inputs, out, ctx)
            if inlined is not None:
                return inlined
        if self.strict:
            raise problem
        if isinstance(out, torch.Tensor):
            return self.b.node(ISLAND, inputs, {"fn": island, "what": ctx.what}, out, ctx)
        leaves, spec = pytree.tree_flatten(out)
        for i, leaf in enumerate(leaves):  # island.at(i) picks the same flattened leaf
            if isinstance(leaf, torch.Tensor):
                leaves[i] = self.b.node(ISLAND, inputs, {"fn": island.at(i), "what": ctx.what},
                                        leaf, ctx)
        return pytree.tree_unflatten(leaves, spec)


    def _inline(self, island: Island, inputs: list[T], out: Any, ctx: Ctx) -> Any:
        """`island`'s call walked op by op from its export (frontend/inline.py): its
        results shaped like `out`, or None (and the builder as it was) where the export
        fails, an op inside is refused, or nothing inside runs in our kernels."""
        kind = type(island.call) if isinstance(island.call, nn.Module) else island.call
        if kind in self.unexportable:  # one failed export per module type or function
            return None
        gm = export_call(island, [t.value for t in inputs])
        if gm is None:
            self.unexportable.add(kind)
            return None
        saved = self.b.snapshot()
        try:
            flat = _Walker(gm, tuple(inputs), self.strict, (self.b, ctx.layer)).run_inside()
        except (UnsupportedOpError, CaptureError):
            self.b.restore(saved)
            return None
        leaves, spec = pytree.tree_flatten(out)
        added = self.b.nodes[len(saved[0]):]
        if len(flat) != len(leaves) or all(n.op == ISLAND for n in added) or any(
                isinstance(v, torch.Tensor) and not isinstance(f, T)
                for v, f in zip(leaves, flat)):
            self.b.restore(saved)
            return None
        return pytree.tree_unflatten(
            [T(f.ref, v) if isinstance(f, T) else v for f, v in zip(flat, leaves)], spec)


def _holds_tensor(v: Any) -> bool:
    return any(isinstance(x, torch.Tensor) for x in pytree.tree_flatten(v)[0])


def _check_index(index: Any, ctx: Ctx) -> None:
    """Indexing by a boolean mask that is a graph value has a shape that depends on values
    (a constant mask does not)."""
    leaves, _ = pytree.tree_flatten(index)
    if any(isinstance(i, T) and i.value.dtype == torch.bool for i in leaves):
        raise DynamicShapeError("boolean mask indexing", ctx.layer)


# ---- nn.Module leaves (torch.fx keeps torch.nn modules as call_module nodes) ----

def _mparam(b: Builder, ctx: Ctx, module: nn.Module, attr: str) -> T | None:
    value = getattr(module, attr, None)
    return None if value is None else b.param(f"{ctx.layer}.{attr}", value)


def conv2d_module_handler(b, m: nn.Conv2d, x, out, ctx):
    if m.padding_mode != "zeros":
        raise ctx.unsupported(f"padding_mode={m.padding_mode!r}")
    a = {"input": x, "weight": _mparam(b, ctx, m, "weight"), "bias": _mparam(b, ctx, m, "bias"),
         "stride": m.stride, "padding": m.padding, "dilation": m.dilation, "groups": m.groups}
    return ops.conv2d_handler(b, a, out, ctx)


def linear_module_handler(b, m: nn.Linear, x, out, ctx):
    a = {"input": x, "weight": _mparam(b, ctx, m, "weight"), "bias": _mparam(b, ctx, m, "bias")}
    return ops.dense_handler(b, a, out, ctx)


def batch_norm_module_handler(b, m: nn.modules.batchnorm._BatchNorm, x, out, ctx):
    a = {"input": x, "running_mean": m.running_mean, "running_var": m.running_var,
         "weight": m.weight, "bias": m.bias, "training": m.training, "eps": m.eps}
    if isinstance(a["weight"], torch.Tensor):
        a["weight"], a["bias"] = m.weight.detach(), m.bias.detach()
    return ops.batch_norm_handler(b, a, out, ctx)


def _unary_module_handler(op: str):
    return lambda b, m, x, out, ctx: ops.unary(op)(b, {"input": x}, out, ctx)


def gelu_module_handler(b, m: nn.GELU, x, out, ctx):
    return ops.gelu_handler(b, {"input": x, "approximate": m.approximate}, out, ctx)


def hardtanh_module_handler(b, m: nn.Hardtanh, x, out, ctx):
    return ops.hardtanh_handler(b, {"input": x, "min_val": m.min_val, "max_val": m.max_val}, out,
                                ctx)


def max_pool_module_handler(b, m: nn.MaxPool2d, x, out, ctx):
    a = {"input": x, "kernel_size": m.kernel_size, "stride": m.stride, "padding": m.padding,
         "dilation": m.dilation, "ceil_mode": m.ceil_mode, "return_indices": m.return_indices}
    return ops.max_pool_handler(b, a, out, ctx)


def avg_pool_module_handler(b, m: nn.AvgPool2d, x, out, ctx):
    a = {"input": x, "kernel_size": m.kernel_size, "stride": m.stride, "padding": m.padding,
         "ceil_mode": m.ceil_mode, "count_include_pad": m.count_include_pad,
         "divisor_override": m.divisor_override}
    return ops.avg_pool_handler(b, a, out, ctx)


def softmax_module_handler(b, m: nn.Softmax, x, out, ctx):
    return ops.softmax_handler(b, {"input": x, "dim": m.dim}, out, ctx)


def layer_norm_module_handler(b, m: nn.LayerNorm, x, out, ctx):
    a = {"input": x, "normalized_shape": m.normalized_shape, "eps": m.eps,
         "weight": _mparam(b, ctx, m, "weight"), "bias": _mparam(b, ctx, m, "bias")}
    return ops.layer_norm_handler(b, a, out, ctx)


def group_norm_module_handler(b, m: nn.GroupNorm, x, out, ctx):
    a = {"input": x, "num_groups": m.num_groups, "eps": m.eps,
         "weight": _mparam(b, ctx, m, "weight"), "bias": _mparam(b, ctx, m, "bias")}
    return ops.group_norm_handler(b, a, out, ctx)


def instance_norm_module_handler(b, m: nn.modules.instancenorm._InstanceNorm, x, out, ctx):
    a = {"input": x, "eps": m.eps, "weight": _mparam(b, ctx, m, "weight"),
         "bias": _mparam(b, ctx, m, "bias"), "running_mean": m.running_mean,
         "running_var": m.running_var,
         "use_input_stats": m.training or not m.track_running_stats}
    return ops.instance_norm_handler(b, a, out, ctx)


def upsample_module_handler(b, m: nn.Upsample, x, out, ctx):
    a = {"input": x, "size": m.size, "scale_factor": m.scale_factor, "mode": m.mode,
         "align_corners": m.align_corners,
         "recompute_scale_factor": m.recompute_scale_factor}
    return ops.interpolate_handler(b, a, out, ctx)


_MODULES = {
    nn.Conv2d: conv2d_module_handler, nn.Conv1d: conv1d_module_handler,
    nn.Linear: linear_module_handler,
    nn.BatchNorm1d: batch_norm_module_handler, nn.BatchNorm2d: batch_norm_module_handler,
    nn.ReLU: _unary_module_handler("relu"), nn.ReLU6: _unary_module_handler("relu6"),
    nn.Sigmoid: _unary_module_handler("sigmoid"), nn.SiLU: _unary_module_handler("silu"),
    nn.Tanh: _unary_module_handler("tanh"), nn.GELU: gelu_module_handler,
    nn.Hardtanh: hardtanh_module_handler, nn.Hardswish: _unary_module_handler("hardswish"),
    nn.Hardsigmoid: _unary_module_handler("hardsigmoid"), nn.Mish: _unary_module_handler("mish"),
    nn.MaxPool2d: max_pool_module_handler, nn.AvgPool2d: avg_pool_module_handler,
    nn.AdaptiveAvgPool2d: lambda b, m, x, out, ctx: ops.adaptive_avg_handler(
        b, {"input": x, "output_size": m.output_size}, out, ctx),
    nn.Flatten: lambda b, m, x, out, ctx: ops.reshape_handler(b, {"input": x}, out, ctx),
    nn.Unflatten: lambda b, m, x, out, ctx: ops.reshape_handler(b, {"input": x}, out, ctx),
    nn.Softmax: softmax_module_handler, nn.LayerNorm: layer_norm_module_handler,
    nn.GroupNorm: group_norm_module_handler,
    nn.InstanceNorm1d: instance_norm_module_handler,
    nn.InstanceNorm2d: instance_norm_module_handler,
    nn.Upsample: upsample_module_handler,
    nn.Embedding: lambda b, m, x, out, ctx: ops.embedding_handler(
        b, {"input": x, "weight": _mparam(b, ctx, m, "weight"), "max_norm": m.max_norm}, out,
        ctx),
    nn.Dropout: lambda b, m, x, out, ctx: ops.alias_handler(b, {"input": x}, out, ctx),
    nn.Identity: lambda b, m, x, out, ctx: ops.alias_handler(b, {"input": x}, out, ctx),
    **ACTIVATION_MODULES,
}
