"""1-D convolutions as 2-D ones of height 1, tuned as every conv2d task is.

conv1d(x (N, C, L), w (K, C/g, k)) is conv2d(x (N, C, 1, L), w (K, C/g, 1, k)) with the
stride, padding and dilation on the width; the reshapes around it are views. So that the
elementwise ops after it (bias, batch norm, GELU, the sigmoid of ECA attention) still fuse
into the conv, `lift_unit_axis` moves the reshape back to 3-D past them: they run on the
4-D value, their operands given the same axis of 1.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn

from raytune_kernels.frontend.builder import Builder, Ctx, T, need_param, tensor_arg
from raytune_kernels.frontend.graph import ELEMENTWISE_OPS, Graph, Node
from raytune_kernels.frontend.passes import prune_params


def _single(v) -> int:
    return int(v[0]) if isinstance(v, (list, tuple)) else int(v)


def conv1d_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """F.conv1d / aten.conv1d on a batched (N, C, L) input with a constant weight."""
    x, w = tensor_arg(a["input"], ctx), need_param(b, a["weight"], ctx, "weight")
    if x.value.dim() != 3:
        raise ctx.unsupported(f"conv1d on a {x.value.dim()}-D input (batched NCL only)")
    k, dilation = w.value.shape[-1], _single(a["dilation"])
    padding = a["padding"]
    if padding == "same":
        if dilation * (k - 1) % 2:
            raise ctx.unsupported("padding='same' with an even kernel pads asymmetrically")
        padding = dilation * (k - 1) // 2
    padding = 0 if padding == "valid" else _single(padding)
    flat = x.value.unsqueeze(2)
    x4 = b.node("reshape", [x], {"shape": tuple(flat.shape)}, flat, ctx)
    w4 = b.param(b.unique(f"{ctx.layer}.weight_2d"), w.value.unsqueeze(2))
    bias = [need_param(b, a["bias"], ctx, "bias")] if a["bias"] is not None else []
    attrs = {"stride": (1, _single(a["stride"])), "padding": (0, padding),
             "dilation": (1, dilation), "groups": int(a["groups"])}
    y = b.node("conv2d", [x4, w4, *bias], attrs, out.unsqueeze(2), ctx)
    return b.node("reshape", [y], {"shape": tuple(out.shape)}, out, ctx)


def conv1d_module_handler(b: Builder, m: nn.Conv1d, x: T, out: torch.Tensor, ctx: Ctx) -> T:
    if m.padding_mode != "zeros":
        raise ctx.unsupported(f"padding_mode={m.padding_mode!r}")
    a = {"input": x, "weight": b.param(f"{ctx.layer}.weight", m.weight),
         "bias": None if m.bias is None else b.param(f"{ctx.layer}.bias", m.bias),
         "stride": m.stride, "padding": m.padding, "dilation": m.dilation,
         "groups": m.groups}
    return conv1d_handler(b, a, out, ctx)


def _lifted(shape: tuple) -> tuple:
    """(N, C, L) with an axis of 1 at dim 2."""
    return tuple(shape[:2]) + (1,) + tuple(shape[2:])


def lift_unit_axis(graph: Graph) -> Graph:
    """Elementwise ops on a 3-D value that is a 4-D one with its axis of 1 dropped (a
    conv1d's output) run on the 4-D value, the reshape to 3-D moved after them, where
    each is its value's one reader (so that they fuse: an elementwise task of its own
    would rather have 3-D rows); a reshape back to that 4-D shape (the next conv1d's
    input) is the 4-D value itself."""
    params, shapes, users = dict(graph.params), dict(graph.shapes), graph.consumers()
    alone = lambda v, reader: users.get(v) == [reader]  # noqa: E731
    taken = {n.name for n in graph.nodes} | set(params) | {v for v, _ in graph.inputs}
    lifted: dict[str, str] = {}  # 3-D value -> the 4-D value it is a view of
    rename: dict[str, str] = {}
    out: list[Node] = []
    for n in graph.nodes:
        n = replace(n, inputs=tuple(rename.get(v, v) for v in n.inputs))
        src = n.inputs[0] if n.inputs else None
        if n.op == "reshape" and len(n.shape) == 3 and shapes[src] == _lifted(n.shape) \
                and alone(src, n.name):
            lifted[n.name] = src
        elif n.op == "reshape" and src in lifted and n.shape == shapes[lifted[src]]:
            rename[n.name] = lifted[src]
            continue
        elif n.op in ELEMENTWISE_OPS and src in lifted and n.shape == shapes[src] \
                and alone(src, n.name):
            n4 = _on_4d(n, lifted, params, shapes, taken, out)
            out.append(n4)
            n = Node(n.name, "reshape", (n4.name,), (("shape", n.shape),), n.shape, n.layer)
            lifted[n.name] = n4.name
        out.append(n)
    outputs = tuple(rename.get(v, v) for v in graph.outputs)
    # the reshapes nobody reads now go, so the conv's one reader is the op it fuses
    return prune_params(Graph(graph.inputs, tuple(out), outputs, params))


def _fresh(name: str, taken: set) -> str:
    i, new = 1, f"{name}_4d"
    while new in taken:
        new, i = f"{name}_4d_{i}", i + 1
    taken.add(new)
    return new


def _on_4d(n: Node, lifted: dict, params: dict, shapes: dict, taken: set,
           out: list) -> Node:
    """`n` reading the 4-D values: a parameter operand reshaped alike, another 3-D value
    through a reshape node (a view)."""
    inputs = [lifted[n.inputs[0]]]
    for v in n.inputs[1:]:
        if v in lifted:
            inputs.append(lifted[v])
        elif v in params and n.op != "affine":  # affine's operands are (C,) vectors
            padded = (1,) * (3 - params[v].dim()) + tuple(params[v].shape)
            name = _fresh(v, taken)
            params[name] = params[v].reshape(_lifted(padded))
            inputs.append(name)
        elif v in params:
            inputs.append(v)
        else:
            shape = _lifted((1,) * (3 - len(shapes[v])) + tuple(shapes[v]))
            view = Node(_fresh(v, taken), "reshape", (v,), (("shape", shape),), shape,
                        n.layer)
            out.append(view)
            shapes[view.name] = shape
            inputs.append(view.name)
    attrs = dict(n.attrs)
    if n.op == "affine" and attrs.get("axis", 1) % 3 == 2:
        attrs["axis"] = 3
    shape = _lifted(n.shape)
    name = _fresh(n.name, taken)
    shapes[name] = shape
    return replace(n, name=name, inputs=tuple(inputs), attrs=tuple(sorted(attrs.items())),
                   shape=shape)
