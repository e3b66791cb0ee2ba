"""The fused epilogue in CUDA C: per-element statements on the accumulator before the store.

Every kernel family calls `epilogue_lines` with the C variable holding one output value,
the C expression of that value's flat index in the (contiguous) output, and whatever output
coordinates the family already has in registers (conv: the channel; dense: the column).
An operand is read at its broadcast position; a coordinate the family does not give is
recovered from the flat index by constant division, which the compiler turns into a
multiply-shift. Semantics follow reference.py exactly (erf GELU, tanh GELU, relu6 clamp).
"""
from __future__ import annotations

import math
import re

import numpy as np

from raytune_kernels.task import BINARY_OPS, UNARY_OPS, Compute, EpilogueOp, TensorSpec
_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_CALL = {"maximum": "fmaxf", "minimum": "fminf"}
# activations with a parameter a: C expressions of x and a (both plain names or reads)
_PARAMETRIC = {"prelu": "({x} >= 0.0f) ? {x} : {a} * {x}",
               "elu": "({x} > 0.0f) ? {x} : {a} * expm1f({x})"}


class CudaLoweringError(ValueError):
    """A compute or config the CUDA renderer cannot turn into a kernel (named in the text)."""


def flit(x: float) -> str:
    """A float32 C literal equal to float32(x): hex, so no decimal double rounding, the
    same value torch.tensor(x, dtype=float32) holds in the reference."""
    v = float(np.float32(x))
    if math.isinf(v):
        return "(-__int_as_float(0x7f800000))" if v < 0 else "__int_as_float(0x7f800000)"
    if math.isnan(v):
        raise CudaLoweringError("a NaN constant in a kernel")
    return f"{v.hex()}f"


def unary(op: str, v: str) -> str:
    """C expression of the unary epilogue op on variable `v` (a plain identifier)."""
    if op == "relu":
        return f"fmaxf({v}, 0.0f)"
    if op == "relu6":
        return f"fminf(fmaxf({v}, 0.0f), 6.0f)"
    if op == "gelu":  # exact (erf) GELU, torch's default
        return f"0.5f * {v} * (1.0f + erff({v} * {flit(1 / math.sqrt(2))}))"
    if op == "gelu_tanh":
        inner = f"{flit(math.sqrt(2 / math.pi))} * ({v} + 0.044715f * {v} * {v} * {v})"
        return f"0.5f * {v} * (1.0f + tanhf({inner}))"
    if op == "sigmoid":
        return f"1.0f / (1.0f + expf(-{v}))"
    if op == "silu":
        return f"{v} / (1.0f + expf(-{v}))"
    if op == "tanh":
        return f"tanhf({v})"
    if op == "hardsigmoid":
        return f"fminf(fmaxf({v} + 3.0f, 0.0f), 6.0f) / 6.0f"
    if op == "hardswish":
        return f"{v} * fminf(fmaxf({v} + 3.0f, 0.0f), 6.0f) / 6.0f"
    if op == "mish":
        return f"{v} * tanhf(log1pf(expf({v})))"
    if op == "softplus":
        return f"fmaxf({v}, 0.0f) + log1pf(expf(-fabsf({v})))"
    simple = {"exp": "expf({})", "erf": "erff({})", "sqrt": "sqrtf({})", "rsqrt": "rsqrtf({})",
              "square": "({0} * {0})", "neg": "(-{})", "abs": "fabsf({})"}
    if op in simple:
        return simple[op].format(v)
    raise CudaLoweringError(f"unknown unary epilogue op '{op}'")


def operand_specs(compute: Compute) -> list[tuple[EpilogueOp, TensorSpec]]:
    """Every epilogue tensor operand, in reference operand order, with its op."""
    return [(op, spec) for op in compute.epilogue for spec in op.operands]


def broadcast_index(flat: str, out: tuple[int, ...], shape: tuple[int, ...],
                    coords: dict[int, str] | None = None) -> str:
    """C index into a contiguous tensor of `shape` broadcast (numpy rules) to `out`, for
    the output element at flat index `flat`; `coords` gives known coordinates by axis."""
    if len(shape) > len(out):
        raise CudaLoweringError(f"operand of shape {shape} has more axes than {out}")
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    bad = [d for d in range(len(out)) if padded[d] not in (1, out[d])]
    if bad:
        raise CudaLoweringError(f"operand of shape {shape} does not broadcast to {out}")
    if padded == tuple(out):
        return flat
    terms, stride = [], 1
    for d in reversed(range(len(out))):
        if padded[d] != 1:
            coord = (coords or {}).get(d) or _coord(flat, out, d)
            terms.append(f"({coord}) * {stride}" if stride != 1 else f"({coord})")
            stride *= padded[d]
    return " + ".join(reversed(terms)) or "0"


def _coord(flat: str, out: tuple[int, ...], d: int) -> str:
    inner = math.prod(out[d + 1:])
    div = f"({flat}) / {inner}" if inner != 1 else f"({flat})"
    return div if d == 0 else f"{div} % {out[d]}"


def is_full(op: EpilogueOp, spec: TensorSpec, out: tuple[int, ...]) -> bool:
    """Whether the operand holds one value per output element (read at the flat index)."""
    padded = (1,) * (len(out) - len(spec.shape)) + tuple(spec.shape)
    return op.op not in ("bias", "affine") and padded == tuple(out)


def operand_reads(compute: Compute, flat: str, coords: dict[int, str],
                  first: int = 0) -> list[str]:
    """C expressions reading each epilogue operand (buffers e{first}, e{first+1}, ...)
    for the output element at `flat`."""
    out = compute.output.shape
    reads = []
    for i, (op, spec) in enumerate(operand_specs(compute)):
        name = f"e{first + i}"
        if op.op in ("bias", "affine"):
            if op.axis is None or not -len(out) <= op.axis < len(out):
                raise CudaLoweringError(f"{op.op} with axis {op.axis} on an output of "
                                        f"shape {out}")
            axis = op.axis % len(out)
            if tuple(spec.shape) != (out[axis],):
                raise CudaLoweringError(f"{op.op} operand of shape {spec.shape} along axis "
                                        f"{op.axis} of an output of shape {out}")
            reads.append(f"{name}[{coords.get(axis) or _coord(flat, out, axis)}]")
        else:
            reads.append(f"{name}[{broadcast_index(flat, out, spec.shape, coords)}]")
    return reads


def epilogue_lines(compute: Compute, var: str, reads: list[str]) -> list[str]:
    """Statements updating float variable `var` through the epilogue, operands read by the
    C expressions `reads` (operand_reads, or preloaded values)."""
    it = iter(reads)
    lines = []
    for op in compute.epilogue:
        args = [next(it) for _ in op.operands]
        if op.op == "bias":
            lines.append(f"{var} += {args[0]};")
        elif op.op == "affine":
            lines.append(f"{var} = fmaf({var}, {args[0]}, {args[1]});")
        elif op.op in BINARY_OPS:
            if not args and op.scalar is None:
                raise CudaLoweringError(f"'{op.op}' has neither a tensor operand nor a scalar")
            other = args[0] if args else flit(op.scalar)
            left, right = (other, var) if op.reverse else (var, other)
            if op.op in _PARAMETRIC:
                lines.append(f"{var} = {_PARAMETRIC[op.op].format(x=left, a=right)};")
            elif op.op in _CALL:  # NaN in, NaN out, as torch.maximum (fmaxf drops a NaN)
                lines.append(f"{var} = ({left} != {left} || {right} != {right}) ? "
                             f"{left} + {right} : {_CALL[op.op]}({left}, {right});")
            else:
                lines.append(f"{var} = {left} {_SYMBOL[op.op]} {right};")
        elif op.op in UNARY_OPS:
            lines.append(f"{var} = {unary(op.op, var)};")
        else:
            raise CudaLoweringError(f"unknown epilogue op '{op.op}'")
    return lines


def uses(name: str, lines: list[str]) -> bool:
    """Whether C identifier `name` occurs in `lines` (to declare no unused variables)."""
    return any(re.search(rf"\b{name}\b", line) for line in lines)


def epilogue_reason(compute: Compute) -> str | None:
    """None when every epilogue op and operand can be rendered; else why not."""
    try:
        operand_reads(compute, "o", {})
        epilogue_lines(compute, "v", ["x"] * len(operand_specs(compute)))
    except CudaLoweringError as exc:
        return str(exc)
    return None
