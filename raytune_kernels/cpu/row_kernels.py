"""Row kernels: softmax and layer norm over the last axis, reductions of the last axis
(sum, mean, max, min), and bare elementwise tasks.

Each row of N floats is handled by one iteration of a (parallel) row loop: reductions into
vector accumulators then across lanes, scalar registers, and a vector map that writes the
row with the task's epilogue fused (a reduction writes one value per row). Buffers keep
torch's contiguous layout.
Knobs: the vector width (one that divides N; 1 when none does), the number of independent
accumulators in each reduction, and whether the row loop runs in parallel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.task import Compute
from raytune_kernels.cpu.loopnest import (PARALLEL, SERIAL, Access, Affine, Bin, Buffer, For, Ld,
                                          LdScalar, Let, LoopNest, Map, Num, Reduce, Reg, Un)
from raytune_kernels.space import Space

if TYPE_CHECKING:
    import torch

ROW_OPS = ("softmax", "layer_norm", "elementwise", "reduce")


class RowLoweringError(ValueError):
    """A row task whose shape or operands the row lowering does not handle (named)."""


@dataclass(frozen=True)
class RowShape:
    rows: int
    n: int
    channels: int | None  # per-row channel operands (NCHW elementwise), else None


def row_shape(c: Compute) -> RowShape:
    if c.op == "reduce":  # rows of the input, one value out per row
        shape = c.inputs[0].shape
        return RowShape(math.prod(shape[:-1]), shape[-1], None)
    shape = c.output.shape
    if c.op == "softmax" and c.attr("dim") != len(shape) - 1:
        raise RowLoweringError(f"softmax over axis {c.attr('dim')} (only the last axis)")
    if c.op == "layer_norm" and len(c.attr("normalized_shape")) != 1:
        raise RowLoweringError("layer norm over more than the last axis")
    if c.op == "elementwise" and len(shape) == 4 and not _rows_of_last_axis(c):
        if shape[0] != 1:
            raise RowLoweringError("batched NCHW elementwise tasks")
        return RowShape(shape[1], shape[2] * shape[3], shape[1])
    return RowShape(math.prod(shape[:-1]), shape[-1], None)


def _rows_of_last_axis(c: Compute) -> bool:
    """Whether a 4-D elementwise task reads as rows of its last axis rather than as NCHW
    channels: an operand holds one value per last-axis row (Qwen3's per-head RMSNorm
    scale, (1, S, H, 1) on (1, S, H, D)), and every operand reads that way."""
    out = c.output.shape
    rows, per_row = math.prod(out[:-1]), False
    for op in c.epilogue:
        for spec in op.operands:
            size, dims = math.prod(spec.shape), [i for i, d in enumerate(spec.shape) if d != 1]
            if op.op in ("bias", "affine"):
                if op.axis is None or op.axis % len(out) != len(out) - 1:
                    return False
            elif size == rows and spec.shape[-1] == 1 and size != c.output.numel:
                per_row = True
            elif size != c.output.numel and dims != [len(spec.shape) - 1]:
                return False
    return per_row


SSE_LANES = 4  # 128-bit vectors: every x86-64 core has them


def row_space(c: Compute, lanes_options: tuple[int, ...]) -> Space:
    """Vector widths that divide the row. Where none of the CPU's does (Whisper's 1500
    frames, ViT's 197 tokens), every one of its widths ending the row in a partial vector
    (masked loads and stores), 4-float vectors where they divide it, and scalars, whose
    configs earlier records hold: a softmax over 1500 ran 36 ms a layer in scalars."""
    n = row_shape(c).n
    widths = [lanes for lanes in lanes_options if n % lanes == 0] or \
        [lanes for lanes in lanes_options if lanes <= n] + \
        [w for w in (SSE_LANES, 1) if n % w == 0]
    combos = tuple((lanes, accs) for lanes in dict.fromkeys(widths) for accs in (1, 2, 4)
                   if (n // lanes) % accs == 0)
    return Space(("lanes", "accs"), combos, (("parallel", (True, False)),))


def lower_rows(c: Compute, cfg) -> LoopNest:
    shape, lanes = row_shape(c), cfg["lanes"]
    steps, tail = divmod(shape.n, lanes)  # a partial last vector where lanes do not divide
    row = Affine((("r", shape.n), ("j", lanes)))
    x = Ld(Access("x", row))
    body, value, extra = _anchor(c, x, cfg["accs"], steps, lanes, tail)
    names = [f"e{i}" for i in range(sum(len(e.operands) for e in c.epilogue))]
    total = shape.rows * shape.n
    if c.op == "reduce":  # one value per row: the epilogue reads per-row operands
        value = _epilogue(c, value, names, RowShape(shape.rows, 1, None), Affine((("r", 1),)),
                          lanes)
        body.append(Map(Access("out", Affine((("r", 1),))), value, "j", 1, scalar=True))
        out_size, total = shape.rows, shape.rows
    else:
        value = _epilogue(c, value, names, shape, row, lanes)
        body.append(Map(Access("out", row), value, "j", steps, tail=tail))
        out_size = total
    buffers = [Buffer("x", shape.rows * shape.n, "in")] + extra
    buffers += [Buffer(n, _operand_size(c, i, shape, total), "in") for i, n in enumerate(names)]
    buffers.append(Buffer("out", out_size, "out"))
    loop = For("r", shape.rows, PARALLEL if cfg["parallel"] else SERIAL, tuple(body))
    return LoopNest(f"k_{c.key()}", tuple(buffers), (), (loop,), lanes)


def _anchor(c: Compute, x, accs: int, steps: int, lanes: int, tail: int = 0):
    n = steps * lanes + tail
    if c.op == "elementwise":
        return [], x, []
    if c.op == "reduce":
        kind = c.attr("kind")
        if kind == "min":  # the max of the negated row, negated
            return [Reduce("m", "max", Un("neg", x), "j", steps, accs, tail)], \
                Un("neg", Reg("m")), []
        op = "max" if kind == "max" else "sum"
        value = Bin("mul", Reg("m"), Num(1.0 / n)) if kind == "mean" else Reg("m")
        return [Reduce("m", op, x, "j", steps, accs, tail)], value, []
    if c.op == "softmax":  # exp once per element: kept in the output row, then scaled
        row = x.access.index
        kept = Ld(Access("out", row))
        body = [Reduce("max", "max", x, "j", steps, accs, tail),
                Map(Access("out", row), Un("exp", Bin("sub", x, Reg("max"))), "j", steps,
                    tail=tail),
                Reduce("sum", "sum", kept, "j", steps, accs, tail),
                Let("inv", Bin("div", Num(1.0), Reg("sum")))]
        return body, Bin("mul", kept, Reg("inv")), []
    centred = Bin("sub", x, Reg("mean"))
    var = Bin("add", Bin("mul", Reg("sq"), Num(1.0 / n)), Num(c.attr("eps")))
    body = [Reduce("sum", "sum", x, "j", steps, accs, tail),
            Let("mean", Bin("mul", Reg("sum"), Num(1.0 / n))),
            Reduce("sq", "sum", Bin("mul", centred, centred), "j", steps, accs, tail),
            Let("rstd", Bin("div", Num(1.0), Un("sqrt", var)))]
    vec = Affine((("j", lanes),))
    value = Bin("add", Bin("mul", Bin("mul", centred, Reg("rstd")), Ld(Access("w", vec))),
                Ld(Access("b", vec)))
    return body, value, [Buffer("w", n, "in"), Buffer("b", n, "in")]


def _operand_size(c: Compute, i: int, shape: RowShape, total: int) -> int:
    spec = [s for e in c.epilogue for s in e.operands][i]
    return total if math.prod(spec.shape) == total else math.prod(spec.shape)


def _epilogue(c: Compute, value, names, shape: RowShape, row: Affine, lanes: int):
    it = iter(names)
    total = shape.rows * shape.n
    ndim = len(c.output.shape)
    for op in c.epilogue:
        if op.op in ("affine", "bias") and op.axis is not None:  # (C,) operands on an axis
            loads = [_axis_load(next(it), op.axis % ndim, c.output.shape, shape, lanes)
                     for _ in op.operands]
        else:
            loads = [_operand_load(next(it), spec, shape, row, lanes, total)
                     for spec in op.operands]
        value = epilogue_expr(op, value, loads)
    return value


def _axis_load(name: str, axis: int, out: tuple, shape: RowShape, lanes: int):
    """A per-channel operand of an affine or bias along `axis`: one value per row of an
    NCHW task (rows are channels) or of rows whose only other axis is that one ((1, C, L):
    a group norm's weights on a 1-D signal), or a vector along the row when it is the last
    axis."""
    ndim = len(out)
    if shape.channels is not None and axis == 1:
        return LdScalar(Access(name, Affine((("r", 1),))))
    if shape.channels is None and axis == ndim - 2 and math.prod(out[:axis]) == 1:
        return LdScalar(Access(name, Affine((("r", 1),))))
    if shape.channels is None and axis == ndim - 1:
        return Ld(Access(name, Affine((("j", lanes),))))
    raise RowLoweringError(f"a per-channel operand along axis {axis} of rows of {shape.n}")


def epilogue_expr(op, value, loads: list):
    """One epilogue op applied to the vector expression `value`, its tensor operands
    already read as expressions `loads` (row kernels, Winograd's output transform)."""
    if op.op == "affine":
        return Bin("add", Bin("mul", value, loads[0]), loads[1])
    if op.op == "bias":
        return Bin("add", value, loads[0])
    if op.op in ("add", "sub", "mul", "div", "maximum", "minimum"):
        other = loads[0] if loads else Num(op.scalar)
        name = {"maximum": "max", "minimum": "min"}.get(op.op, op.op)
        return Bin(name, other, value) if op.reverse else Bin(name, value, other)
    if op.op in ("prelu", "elu"):
        other = loads[0] if loads else Num(op.scalar)
        x, a = (other, value) if op.reverse else (value, other)
        return _parametric(op.op, x, a)
    return Un(op.op, value)


def _parametric(op: str, x, a):
    """prelu and elu as row expressions: max(x, 0) + a * min(x, 0), and
    max(x, 0) + a * (e^min(x, 0) - 1)."""
    below = Bin("min", x, Num(0.0))
    if op == "elu":
        below = Bin("sub", Un("exp", below), Num(1.0))
    return Bin("add", Bin("max", x, Num(0.0)), Bin("mul", a, below))


def _operand_load(name: str, spec, shape: RowShape, row: Affine, lanes: int, total: int):
    size = math.prod(spec.shape)
    if size == total:  # rows of one value (a reduction's output) are read one at a time
        return LdScalar(Access(name, row)) if shape.n == 1 else Ld(Access(name, row))
    dims = [i for i, d in enumerate(spec.shape) if d != 1]  # the axes it is not broadcast on
    axes = len(spec.shape)
    if shape.channels is not None and size == shape.channels and dims == [axes - 3]:
        return LdScalar(Access(name, Affine((("r", 1),))))  # (C, 1, 1): one per row
    if shape.channels is not None and size == shape.n and all(d >= axes - 2 for d in dims):
        # (1, 1, H, W): the same row for every channel (rotary cos/sin over heads)
        return Ld(Access(name, Affine((("j", lanes),))))
    if shape.channels is None and size == shape.n and dims == [axes - 1]:
        return Ld(Access(name, Affine((("j", lanes),))))  # along the row
    if shape.channels is None and size == shape.rows and spec.shape[-1] == 1:
        return LdScalar(Access(name, Affine((("r", 1),))))  # (..., 1): one per row
    raise RowLoweringError(f"epilogue operand of shape {spec.shape} on rows of {shape.n}")


def pack_rows(c: Compute, cfg, operands) -> dict[str, np.ndarray]:
    flat = [np.ascontiguousarray(t.detach().numpy(), np.float32).ravel() for t in operands]
    names = ["x"] + (["w", "b"] if c.op == "layer_norm" else [])
    names += [f"e{i}" for i in range(len(flat) - len(names))]
    bufs = dict(zip(names, flat))
    bufs["out"] = np.zeros(c.output.numel, np.float32)
    return bufs


def unpack_rows(c: Compute, cfg, flat: np.ndarray) -> torch.Tensor:
    import torch
    return torch.from_numpy(flat.copy()).reshape(c.output.shape)
