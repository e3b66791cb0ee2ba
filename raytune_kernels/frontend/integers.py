"""Casts and integer computations on the inputs, as aliases and glue (no island).

Graph values live in float32 buffers, where integers and booleans below 2**24 are exact,
so a cast that keeps every value (to the value's own dtype, from bool or integers to a
wider integer or to float32: RMSNorm's `x.to(torch.float32)`, RoBERTa's `mask.int()` and
`.long()`) is the value itself. The comparisons, running sums, gathers and argmaxes that
build position ids from token ids (RoBERTa: `ne`, `cumsum`, a `gather` of its token type
buffer; CLIP: the `argmax` of the ids) are glue nodes run by PyTorch between kernels, their
results stored as float32 (0 and 1 for a comparison, indices for an argmax).
"""
from __future__ import annotations

import torch

from raytune_kernels.frontend.builder import Builder, Ctx, T, norm_dim, tensor_arg

COMPARE_FNS = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
               "ge": torch.ge}


def exact_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether casting `src` to `dst` keeps every value a float32 buffer can hold."""
    if src == dst:
        return True
    if src.is_floating_point or src.is_complex or dst.is_complex:
        return False  # float -> int truncates; float -> float64/16 changes the precision
    return dst == torch.float32 or (not dst.is_floating_point and dst != torch.bool)


def cast_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """x.to(dtype) / type_as / float() / long() ...: the value itself when exact_cast."""
    x = tensor_arg(a["input"], ctx)
    if tuple(out.shape) != tuple(x.value.shape):
        raise ctx.unsupported("a cast that changes the shape")
    if not exact_cast(x.value.dtype, out.dtype):
        raise ctx.unsupported(f"a cast from {x.value.dtype} to {out.dtype} (casts that keep "
                              "every value are lowered)")
    return T(x.ref, out)


def compare_handler(kind: str):
    """x.ne(c), x == y, ...: a glue node giving 1.0 where the comparison holds, else 0.0."""
    def handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
        x, y = a["input"], a["other"]
        if not isinstance(x, T):
            raise ctx.unsupported("a comparison whose first operand is a constant")
        if isinstance(y, T):
            return b.node("compare", [x, y], {"kind": kind}, out, ctx)
        if not isinstance(y, (int, float)) or isinstance(y, bool):
            raise ctx.unsupported(f"a comparison with a {type(y).__name__}")
        return b.node("compare", [x], {"kind": kind, "scalar": float(y)}, out, ctx)
    return handler


def cumsum_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """torch.cumsum along a dim: a glue node (a running sum of ids or of a mask)."""
    x = tensor_arg(a["input"], ctx)
    if a.get("dtype") is not None and not exact_cast(x.value.dtype, a["dtype"]):
        raise ctx.unsupported(f"a cumsum into {a['dtype']}")
    return b.node("cumsum", [x], {"dim": norm_dim(int(a["dim"]), x.value.dim())}, out, ctx)


def gather_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """torch.gather(x, dim, ids): glue; a constant table or index (an integer buffer) is
    made a parameter first."""
    x = _graph_value(b, a["input"], ctx, "table")
    ids = _graph_value(b, a["index"], ctx, "index")
    dim = norm_dim(int(a["dim"]), x.value.dim())
    return b.node("gather", [x, ids], {"dim": dim}, out, ctx)


def argmax_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """argmax along a dim (the first largest, as PyTorch): glue giving float32 indices."""
    x = tensor_arg(a["input"], ctx)
    if a["dim"] is None:
        raise ctx.unsupported("an argmax of the flattened tensor (no dim)")
    attrs = {"dim": norm_dim(int(a["dim"]), x.value.dim()), "keepdim": bool(a["keepdim"])}
    return b.node("argmax", [x], attrs, out, ctx)


_EXACT = 2 ** 24  # integers up to this magnitude are exact in float32


def _graph_value(b: Builder, v, ctx: Ctx, role: str) -> T:
    """`v` itself when a graph value; a constant integer tensor as a float32 parameter."""
    if isinstance(v, T):
        return v
    if isinstance(v, torch.Tensor) and not v.is_floating_point() and not v.is_complex() \
            and (v.numel() == 0 or int(v.abs().max()) <= _EXACT):
        return b.param(b.unique(f"{ctx.layer}.{role}"), v.to(torch.float32))
    raise ctx.unsupported(f"a {role} that is neither a graph value nor integers")
