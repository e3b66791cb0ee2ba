"""Data movement by constants as glue (run by PyTorch between kernels, no task of their own):
slices, constant and reflect padding, roll, expand, stack, unfold's sliding windows; and
einsum of two operands as the permutes, reshapes and one batched matmul it stands for, so
its FLOPs run in our kernels."""
from __future__ import annotations

import torch

from raytune_kernels.frontend.builder import Builder, Ctx, T, norm_dim, tensor_arg
from raytune_kernels.frontend.slicing import encode_index


def slice_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """aten.slice(x, dim, start, end, step): what x[..., a:b:c] exports to."""
    x = tensor_arg(a["input"], ctx)
    dim = norm_dim(int(a["dim"]), x.value.dim())
    if tuple(out.shape) == tuple(x.value.shape):
        return T(x.ref, out)
    index = (slice(None),) * dim + (slice(a["start"], a["end"], a["step"]),)
    return b.node("index", [x], {"index": encode_index(index)}, out, ctx)


PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """F.pad with constant amounts; the value of constant padding is kept."""
    x = tensor_arg(a["input"], ctx)
    if a["mode"] not in PAD_MODES:
        raise ctx.unsupported(f"pad mode {a['mode']!r}")
    pad = tuple(int(p) for p in a["pad"])
    if not any(pad):
        return T(x.ref, out)
    value = float(a["value"] or 0.0) if a["mode"] == "constant" else None
    return b.node("pad", [x], {"pad": pad, "mode": a["mode"], "value": value}, out, ctx)


def roll_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """torch.roll by constant shifts along given dims (Swin's shifted windows)."""
    x = tensor_arg(a["input"], ctx)
    shifts, dims = a["shifts"], a["dims"]
    shifts = tuple(shifts) if isinstance(shifts, (list, tuple)) else (shifts,)
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        raise ctx.unsupported("roll of the flattened tensor (no dims)")
    dims = tuple(dims) if isinstance(dims, (list, tuple)) else (dims,)
    dims = tuple(norm_dim(int(d), x.value.dim()) for d in dims)
    return b.node("roll", [x], {"shifts": tuple(int(s) for s in shifts), "dims": dims},
                  out, ctx)


def expand_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """expand / expand_as / broadcast_to / repeat to a constant shape."""
    x = tensor_arg(a["input"], ctx)
    if tuple(out.shape) == tuple(x.value.shape):
        return T(x.ref, out)
    if ctx.what.endswith("repeat"):
        reps = a["args"][0] if len(a["args"]) == 1 and isinstance(a["args"][0], (list, tuple)) \
            else a["args"]
        return b.node("repeat", [x], {"repeats": tuple(int(r) for r in reps)}, out, ctx)
    return b.node("expand", [x], {"shape": tuple(out.shape)}, out, ctx)


def stack_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """torch.stack: each tensor given an axis of 1 at `dim` (a reshape), then one concat
    (GPT-J's interleaved rotary embedding stacks the two halves)."""
    xs = [tensor_arg(t, ctx) for t in a["tensors"]]
    dim = norm_dim(int(a["dim"]), out.dim())
    parts = []
    for x in xs:
        value = x.value.unsqueeze(dim)
        parts.append(b.node("reshape", [x], {"shape": tuple(value.shape)}, value, ctx))
    return b.node("concat", parts, {"dim": dim}, out, ctx)


MAX_WINDOWS = 64  # unfold's windows, one slice node each


def unfold_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """x.unfold(dim, size, step): sliding windows (HaloNet's overlapping blocks) as one
    slice per window with an axis of 1 at `dim`, one concat, then the window's own axis
    moved last, where unfold puts it."""
    x = tensor_arg(a["input"], ctx)
    dim = norm_dim(int(a["dimension"]), x.value.dim())
    size, step, count = int(a["size"]), int(a["step"]), out.shape[dim]
    if count > MAX_WINDOWS:
        raise ctx.unsupported(f"unfold into {count} windows (at most {MAX_WINDOWS})")
    parts = []
    for i in range(count):
        index = (slice(None),) * dim + (None, slice(i * step, i * step + size))
        parts.append(b.node("index", [x], {"index": encode_index(index)}, x.value[index], ctx))
    stacked = torch.cat([p.value for p in parts], dim) if count > 1 else parts[0].value
    y = b.node("concat", parts, {"dim": dim}, stacked, ctx) if count > 1 else parts[0]
    order = tuple(d for d in range(out.dim()) if d != dim + 1) + (dim + 1,)
    if order == tuple(range(out.dim())):
        return T(y.ref, out)
    return b.node("permute", [y], {"dims": order}, out, ctx)


def einsum_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """A two-operand einsum without repeated or summed-alone indices: the operands permuted
    to (batch, rows, contracted) and (batch, contracted, columns), one batched matmul, and
    the result permuted to the equation's order."""
    equation, operands = a["equation"], a["operands"]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if len(operands) != 2:
        raise ctx.unsupported(f"einsum of {len(operands)} operands (two are lowered)")
    x, y = (tensor_arg(t, ctx, "operand") for t in operands)
    terms = _einsum_terms(equation, x.value.dim(), y.value.dim(), ctx)
    (left, right), result = terms
    if len(set(left)) != len(left) or len(set(right)) != len(right):
        raise ctx.unsupported("einsum with a repeated index in one operand (a diagonal)")
    if any(c not in right and c not in result for c in left) or \
            any(c not in left and c not in result for c in right):
        raise ctx.unsupported("einsum that sums an index of one operand alone")
    batch = [c for c in result if c in left and c in right]
    rows = [c for c in result if c in left and c not in right]
    cols = [c for c in result if c in right and c not in left]
    inner = [c for c in left if c in right and c not in result]
    size = {c: n for c, n in zip(left, x.value.shape)}
    size.update({c: n for c, n in zip(right, y.value.shape)})
    if any(size[c] != n for c, n in zip(left, x.value.shape)):
        raise ctx.unsupported("einsum operands disagree on the size of an index")
    prod = lambda cs: int(torch.tensor([size[c] for c in cs] or [1]).prod())  # noqa: E731
    xm = _arrange(b, x, left, batch + rows + inner,
                  [size[c] for c in batch] + [prod(rows), prod(inner)], ctx)
    ym = _arrange(b, y, right, batch + inner + cols,
                  [size[c] for c in batch] + [prod(inner), prod(cols)], ctx)
    product = xm.value @ ym.value
    z = b.node("matmul", [xm, ym], {}, product, ctx)
    grouped = batch + rows + cols
    full = product.reshape([size[c] for c in grouped])
    if tuple(full.shape) != tuple(product.shape):
        z = b.node("reshape", [z], {"shape": tuple(full.shape)}, full, ctx)
    dims = tuple(grouped.index(c) for c in result)
    if dims != tuple(range(len(dims))):
        z = b.node("permute", [z], {"dims": dims}, full.permute(dims), ctx)
    return T(z.ref, out)


def _einsum_terms(equation: str, nx: int, ny: int, ctx: Ctx) -> tuple:
    """The equation's operand and result index strings, with '...' spelled out as
    upper-case letters the equation does not use."""
    eq = equation.replace(" ", "")
    if "->" not in eq:
        raise ctx.unsupported("einsum without an explicit result ('->')")
    inputs, result = eq.split("->")
    parts = inputs.split(",")
    if len(parts) != 2:
        raise ctx.unsupported("einsum equation does not name two operands")
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    width = max(nx - len(parts[0].replace("...", "")), ny - len(parts[1].replace("...", "")), 0)
    fill = "".join(spare[:width])

    def spell(term: str, ndim: int) -> str:
        if "..." not in term:
            return term
        own = ndim - len(term.replace("...", ""))
        return term.replace("...", fill[width - own:])
    left, right = spell(parts[0], nx), spell(parts[1], ny)
    if len(left) != nx or len(right) != ny:
        raise ctx.unsupported("einsum equation does not match the operands' ranks")
    return (left, right), spell(result, width + len(result.replace("...", "")))


def _arrange(b: Builder, x: T, have: list | str, want: list, shape: list, ctx: Ctx) -> T:
    """`x` permuted from index order `have` to `want`, then reshaped to `shape`."""
    dims = tuple(list(have).index(c) for c in want)
    value = x.value
    if dims != tuple(range(len(dims))):
        value = value.permute(dims)
        x = b.node("permute", [x], {"dims": dims}, value, ctx)
    if list(value.shape) != list(shape):
        value = value.reshape(shape)
        x = b.node("reshape", [x], {"shape": tuple(shape)}, value, ctx)
    return T(x.ref, value)
