"""Slicing as glue: chunk, split, unbind and indexing by constants become `index` nodes
(run by PyTorch between kernels, no task of their own); the index is kept as hashable data."""
from __future__ import annotations

import torch

from raytune_kernels.frontend.builder import Builder, Ctx, T, norm_dim, tensor_arg


def getitem_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """Indexing by constants (ints, slices, None, ..., constant index tensors) and by
    integer tensors computed at run time (CLIP's pooled token, at the argmax of the ids):
    glue, whose extra inputs are those index tensors."""
    x, index = tensor_arg(a["input"], ctx), a["index"]
    items = index if isinstance(index, tuple) else (index,)
    computed = [i for i in items if isinstance(i, T)]
    if any(i.value.dtype == torch.bool or i.value.is_floating_point() for i in computed):
        raise ctx.unsupported("indexing by a computed mask or float tensor")
    slots = iter(range(len(computed)))
    items = tuple(_Input(next(slots)) if isinstance(i, T) else i for i in items)
    return b.node("index", [x, *computed], {"index": encode_index(items)}, out, ctx)


class _Input(int):
    """The position of a run-time index tensor among an index node's extra inputs."""


def index_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """aten.index(x, [None, ..., t]): what x[..., [i, j]] exports to; a None there takes
    the whole dim (glue, as getitem_handler)."""
    items = tuple(slice(None) if i is None else i for i in a["indices"])
    return getitem_handler(b, {"input": a["input"], "index": items}, out, ctx)


def select_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """x.select(dim, i), x[:, 0]: one index along one dim (glue)."""
    x = tensor_arg(a["input"], ctx)
    if isinstance(a["index"], T):
        raise ctx.unsupported("select by a computed index")
    index = (slice(None),) * norm_dim(int(a["dim"]), x.value.dim()) + (int(a["index"]),)
    return b.node("index", [x], {"index": encode_index(index)}, out, ctx)


def split_handler(b: Builder, a: dict, outs: list[torch.Tensor], ctx: Ctx) -> list[T]:
    """chunk / split / split_with_sizes: one slice of the input per output (glue)."""
    x = tensor_arg(a["input"], ctx)
    dim, start, parts = norm_dim(int(a["dim"]), x.value.dim()), 0, []
    for o in outs:
        n = o.shape[dim]
        index = (slice(None),) * dim + (slice(start, start + n),)
        parts.append(b.node("index", [x], {"index": encode_index(index)}, o, ctx))
        start += n
    return parts


def unbind_handler(b: Builder, a: dict, outs: list[torch.Tensor], ctx: Ctx) -> list[T]:
    x = tensor_arg(a["input"], ctx)
    dim = norm_dim(int(a["dim"]), x.value.dim())
    return [b.node("index", [x], {"index": encode_index((slice(None),) * dim + (i,))}, o, ctx)
            for i, o in enumerate(outs)]


def encode_index(items: tuple) -> tuple:
    """An index as hashable data: slices, ints, None, Ellipsis and constant tensors."""
    out = []
    for i in items:
        if isinstance(i, _Input):
            out.append(("input", int(i)))
        elif isinstance(i, slice):
            out.append(("slice", i.start, i.stop, i.step))
        elif i is None or i is Ellipsis:
            out.append(("none",) if i is None else ("ellipsis",))
        elif isinstance(i, (int, torch.Tensor)) and not isinstance(i, bool):
            out.append(("item", i))
        elif isinstance(i, list):  # x[:, [0, 2]]: the same index as a tensor
            out.append(("item", torch.tensor(i)))
        else:
            raise TypeError(f"index item of type {type(i).__name__}")
    return tuple(out)


def decode_index(code: tuple, computed: tuple = ()) -> tuple:
    """The index `code` stands for, its run-time index tensors taken from `computed` (held
    as float32 graph values: made integers again)."""
    return tuple(slice(*c[1:]) if c[0] == "slice" else None if c[0] == "none"
                 else Ellipsis if c[0] == "ellipsis"
                 else computed[c[1]].long() if c[0] == "input" else c[1] for c in code)
