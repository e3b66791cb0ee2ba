"""The measuring contract every backend shares: the options a measurement takes, its
result (times, or an error kind and message: errors are data), the random operands a
candidate runs on and the check of its output against the task's torch reference.

The CPU's measurer is cpu/measure.py, the GPU's cuda/measure.py.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from raytune_kernels.task import Compute
from raytune_kernels.timing import TimingOptions

if TYPE_CHECKING:
    import torch

BUILD_ERROR, RUNTIME_ERROR, WRONG_OUTPUT, NON_FINITE = (
    "build_error", "runtime_error", "wrong_output", "non_finite")
TIMEOUT, CRASHED = "timeout", "crashed"
HOST_ERROR = "host_error"  # the machine's fault (full temp dir), after retries: not the config's
ERROR_KINDS = (BUILD_ERROR, RUNTIME_ERROR, WRONG_OUTPUT, NON_FINITE, TIMEOUT, CRASHED,
               HOST_ERROR)
# writing the .so and dlopen; lowering, operands, reference, packing, a first run and the
# comparison; warm-up and the timed repeats (cpu/measure.py's measure_built)
MEASURE_PHASES = ("load", "check", "timing")


@dataclass(frozen=True)
class MeasureOptions:
    threads: int = 1
    warmup: int = 2
    min_repeat_ms: float = 20.0
    repeats: int = 3
    flush_cache: bool = False
    rtol: float = 1e-4
    atol: float = 1e-4
    seed: int = 0
    timeout_s: float = 60.0  # enforced by the caller that owns the measuring process
    build_timeout_s: float = 120.0  # a build past it is a build error, its builder replaced
    # Time conv/dense kernels with their weights out of cache (rotating copies): in a
    # network every layer's weights come from memory, and schedules that stream them well
    # are not the ones that win with weights resident (up to 2.6x apart on ResNet-18).
    cold_weights: bool = False
    # A set of repeats whose median is more than `settle` above its fastest is timed again,
    # up to `retries` times, the most settled set kept (timing.py). In the records of
    # bench/results, 1-3% of the sets of 3 repeats lie that far apart on a quiet 2-vCPU VM,
    # up to 20% on a busy one, and 0.1-0.5% on a GPU.
    settle: float = 0.15
    retries: int = 2

    def timing(self) -> TimingOptions:
        return TimingOptions(self.warmup, self.min_repeat_ms, self.repeats, self.settle,
                             self.retries)


@dataclass(frozen=True)
class MeasureResult:
    """Seconds per call (one per repeat), or an error kind and message; never both."""

    times: tuple[float, ...] = ()
    error_kind: str | None = None
    error_msg: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    # (phase, seconds) of run_s (MEASURE_PHASES) where the measurer timed them, else ()
    phases: tuple[tuple[str, float], ...] = ()

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.ok and self.times else math.inf

    @classmethod
    def error(cls, kind: str, msg: str, build_s: float = 0.0, run_s: float = 0.0,
              phases: tuple[tuple[str, float], ...] = ()):
        assert kind in ERROR_KINDS, kind
        return cls((), kind, msg[:2000], build_s, run_s, phases)

    def to_json(self) -> dict:
        return {"times": list(self.times), "error_kind": self.error_kind,
                "error_msg": self.error_msg, "build_s": self.build_s, "run_s": self.run_s,
                "phases": [[name, s] for name, s in self.phases]}

    @classmethod
    def from_json(cls, d: dict) -> "MeasureResult":
        """Also reads JSON written before results had phases."""
        return cls(tuple(float(t) for t in d["times"]), d["error_kind"], d["error_msg"],
                   float(d["build_s"]), float(d["run_s"]),
                   tuple((str(name), float(s)) for name, s in d.get("phases", ())))


def rotating_copies(nbytes: int, cover_bytes: int) -> int:
    """Copies of a buffer of `nbytes` that together cover `cover_bytes` (twice a cache), at
    most 256, at least 2: a kernel cycling through them finds each out of that cache when
    its turn comes."""
    return max(2, min(256, -(-cover_bytes // max(nbytes, 1))))


def random_operands(compute: Compute, seed: int = 0) -> list[torch.Tensor]:
    """Random operands in reference order, weights scaled by 1/sqrt(fan-in) as trained
    weights are, so outputs stay of unit size and tolerances mean the same everywhere."""
    import torch
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(compute.inputs[0].shape, generator=g)]
    for spec in compute.inputs[1:]:
        if compute.op == "layer_norm":
            xs.append(torch.randn(spec.shape, generator=g))
            continue
        fan_in = spec.shape[-2] if compute.op == "matmul" else math.prod(spec.shape[1:])
        xs.append(torch.randn(spec.shape, generator=g) / math.sqrt(max(fan_in, 1)))
    xs += [torch.randn(s.shape, generator=g) for e in compute.epilogue for s in e.operands]
    return xs


def operands_and_reference(compute: Compute, seed: int = 0,
                           ref: Callable[[list[torch.Tensor]], torch.Tensor] | None = None
                           ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """random_operands and the task's reference output on them (`ref`: exact_reference
    by default). Where the task's function is undefined on those draws (an RMSNorm's
    rsqrt of a mean that random signs made negative: the reference itself is NaN), the
    same draws made positive instead, so that such tasks are checked and timed rather than
    failing every candidate as non-finite."""
    import torch

    ref = ref or (lambda xs: exact_reference(compute, xs))
    ops = random_operands(compute, seed)
    with torch.no_grad():
        expected = ref(ops)
        if not torch.isfinite(expected).all():
            ops = [x.abs() for x in ops]
            expected = ref(ops)
    return ops, expected


_LAST_TASK: dict = {}  # (compute, seed, reference) -> operands_and_reference, one task


def last_task_operands(compute: Compute, seed: int = 0, reference: str = "exact",
                       ref: Callable[[list[torch.Tensor]], torch.Tensor] | None = None
                       ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """operands_and_reference, kept for the task measured last: a round measures one
    task's candidates one after another on the same draws. Drawing a conv's operands and
    computing its reference took 5-12 ms of each ~110 ms measurement of a ResNet-18 conv
    on a CPU at 1 thread; a GPU measurer, whose candidates time in tens of milliseconds,
    drew them for each. `reference` names the reference function (`ref`; the float64
    exact_reference by default), so two kinds never share a result. Kernels never write
    the operands: they run on packed copies."""
    key = (compute, seed, reference)
    if key not in _LAST_TASK:
        _LAST_TASK.clear()
        _LAST_TASK[key] = operands_and_reference(compute, seed, ref)
    return _LAST_TASK[key]


def exact_reference(compute: Compute, operands: list[torch.Tensor]) -> torch.Tensor:
    """reference() computed in float64 from the operands, then rounded to the output's
    float32: the oracle a candidate is checked against. torch's float32 functions are not
    one: its float32 tanh once returned errors up to 5e-5 on half of a tensor (one
    thread's share) at its first call in a checking process, and a correct GELU kernel
    (6e-7 from float64) failed its check against it, so that its steps ran PyTorch's."""
    import torch

    from raytune_kernels.frontend.reference import reference

    wide = [x.double() if x.is_floating_point() else x for x in operands]
    out = reference(compute, *wide)
    return out.float() if out.dtype == torch.float64 else out


def check_output(got: torch.Tensor, expected: torch.Tensor, opts: MeasureOptions):
    """None when the candidate's output is right; else (error kind, message)."""
    import torch
    if got.shape != expected.shape:
        return WRONG_OUTPUT, f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
    if not torch.isfinite(got).all():
        bad = (~torch.isfinite(got)).sum().item()
        return NON_FINITE, f"{bad} of {got.numel()} outputs are NaN or infinite"
    if not torch.allclose(got, expected, rtol=opts.rtol, atol=opts.atol):
        err = (got - expected).abs().max().item()
        return WRONG_OUTPUT, f"max abs error {err:.3g} (rtol {opts.rtol}, atol {opts.atol})"
    return None
