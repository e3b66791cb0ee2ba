"""Arithmetic precision of a target, and the tolerance each one is checked with.

"fp32" (the default) is exact float32 arithmetic: on a GPU only the FFMA kernels run.
On cuda, "tf32", "fp16" and "bf16" also admit tensor-core kernels (mma.sync) whose
operands are rounded to that format on their way to the tensor cores, always accumulating
in float32; activations and weights stay float32 in memory, so every precision reads and
writes the same buffers. On llvm, "bf16" also admits convolutions, denses and matmuls
on AMX tiles (cpu/amx.py): operands rounded to bf16 on their way in, weights packed in
bf16, float32 accumulation and float32 activations in memory.

Tolerances are of the output's scale: a kernel's output is compared with its float32
reference by torch.allclose(rtol, atol) on the measurer's unit-scaled operands, a network's
output with model(x) as the largest difference over the largest magnitude. A format with
a t-bit stored mantissa rounds each operand by up to 2^-(t+1) of itself: 2^-11 for tf32
and fp16 (10 bits), 2^-8 for bf16 (7 bits); sums over a long reduction average those
errors out, so the bounds below leave about ten times the expected error for a kernel,
and room for tens of layers for a network.
"""
from __future__ import annotations

from dataclasses import dataclass

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
DEFAULT = "fp32"


@dataclass(frozen=True)
class Tolerance:
    kernel_rtol: float  # one kernel against its reference (torch.allclose)
    kernel_atol: float
    network: float  # a compiled network against model(x), of the output's scale


TOLERANCES = {
    "fp32": Tolerance(1e-4, 1e-4, 1e-3),
    "tf32": Tolerance(1e-2, 1e-2, 1e-2),
    "fp16": Tolerance(1e-2, 1e-2, 1e-2),
    "bf16": Tolerance(5e-2, 5e-2, 5e-2),
}


def tolerance(precision: str) -> Tolerance:
    """The tolerances of `precision` (one of PRECISIONS)."""
    if precision not in TOLERANCES:
        raise ValueError(f"unknown precision {precision!r}: expected one of {PRECISIONS}")
    return TOLERANCES[precision]
