"""Reference implementations of every task compute, with torch functional ops.

These define what a candidate kernel must compute: every tuned kernel is checked against
`reference(compute, *operands)` before its time counts.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from raytune_kernels.task import Compute, EpilogueOp


def reference(compute: Compute, *operands: torch.Tensor) -> torch.Tensor:
    """Evaluate `compute` on `operands`: its inputs, then each epilogue op's operands."""
    n_in = len(compute.inputs)
    acc = _anchor(compute, operands[:n_in])
    rest = list(operands[n_in:])
    for op in compute.epilogue:
        args, rest = rest[: len(op.operands)], rest[len(op.operands):]
        acc = apply_epilogue(op, acc, args)
    if rest:
        raise ValueError(f"{len(rest)} operands left over for {compute.describe()}")
    return acc


def _anchor(c: Compute, xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    a = c.attr
    if c.op == "conv2d":
        return F.conv2d(xs[0], xs[1], None, a("stride"), a("padding"), a("dilation"),
                        a("groups"))
    if c.op == "dense":
        return F.linear(xs[0], xs[1])
    if c.op == "matmul":
        return torch.matmul(xs[0], xs[1])
    if c.op == "max_pool2d":
        return F.max_pool2d(xs[0], a("kernel"), a("stride"), a("padding"), a("dilation"),
                            a("ceil_mode"))
    if c.op == "avg_pool2d":
        return F.avg_pool2d(xs[0], a("kernel"), a("stride"), a("padding"), a("ceil_mode"),
                            a("count_include_pad"))
    if c.op == "adaptive_avg_pool2d":
        return F.adaptive_avg_pool2d(xs[0], a("output_size"))
    if c.op == "softmax":
        return torch.softmax(xs[0], a("dim"))
    if c.op == "layer_norm":
        return F.layer_norm(xs[0], a("normalized_shape"), xs[1], xs[2], a("eps"))
    if c.op == "reduce":  # over the last axis, kept as an axis of 1
        return REDUCE_FNS[a("kind")](xs[0])
    if c.op == "elementwise":
        return xs[0]
    raise ValueError(f"no reference for op '{c.op}'")


# the reductions of a "reduce" task, over the last axis (keepdim); min and max propagate NaN
REDUCE_FNS = {
    "sum": lambda x: x.sum(-1, keepdim=True), "mean": lambda x: x.mean(-1, keepdim=True),
    "max": lambda x: x.amax(-1, keepdim=True), "min": lambda x: x.amin(-1, keepdim=True),
}

UNARY_FNS = {
    "relu": torch.relu, "relu6": lambda x: torch.clamp(x, 0.0, 6.0),
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "sigmoid": torch.sigmoid, "silu": F.silu, "tanh": torch.tanh,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "mish": F.mish, "exp": torch.exp,
    "erf": torch.erf, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "square": torch.square,
    "neg": torch.neg, "abs": torch.abs, "softplus": F.softplus,
}
BINARY_FNS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
              "maximum": torch.maximum, "minimum": torch.minimum,
              "prelu": lambda x, a: torch.where(x >= 0, x, a * x),
              "elu": lambda x, a: torch.where(x > 0, x, a * torch.expm1(x))}


def apply_epilogue(op: EpilogueOp, acc: torch.Tensor, args: list) -> torch.Tensor:
    if op.op in UNARY_FNS:
        return UNARY_FNS[op.op](acc)
    if op.op in ("bias", "affine"):
        view = [1] * acc.dim()
        view[op.axis] = -1
        out = acc * args[0].reshape(view) if op.op == "affine" else acc + args[0].reshape(view)
        return out + args[1].reshape(view) if op.op == "affine" else out
    if op.op in BINARY_FNS:
        other = args[0] if op.operands else torch.tensor(op.scalar, dtype=acc.dtype)
        return BINARY_FNS[op.op](other, acc) if op.reverse else BINARY_FNS[op.op](acc, other)
    raise ValueError(f"unknown epilogue op '{op.op}'")
