"""What a compiled network reports about itself, on any device: the per-step profile
(ours in the network, ours alone, PyTorch's own time for the layer) with its table and
chart, and the fidelity of the tuner's estimate to the measured latency."""
from __future__ import annotations

import copy
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

SCALE_FLOOR = 1e-12  # the scale of an all-zero value: any difference from it counts


def scaled_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference of two values over the value's scale (its largest magnitude):
    float rounding grows with the values, so a network of large activations is held to the
    same relative standard as one of small ones, and a value of tiny outputs is not passed
    by an absolute bound larger than itself. NaN where either holds a non-finite number."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    if not (torch.isfinite(got).all() and torch.isfinite(want).all()):
        return math.nan
    if not want.numel():
        return 0.0
    scale = max(want.abs().max().item(), SCALE_FLOOR)
    return (got - want).abs().max().item() / scale


def random_inputs(shapes, examples=None, seed: int = 0) -> list[torch.Tensor]:
    """Inputs to time a network on: random normal floats of each input's shape; where the
    example input the network was compiled with holds integers or booleans (token ids, a
    mask), its own values shuffled, so ids stay within the table they index."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, shape in enumerate(shapes):
        ex = examples[i] if examples is not None else None
        if ex is None or ex.is_floating_point():
            out.append(torch.randn(tuple(shape), generator=g))
        else:
            flat = ex.detach().cpu().reshape(-1)
            out.append(flat[torch.randperm(flat.numel(), generator=g)].reshape(ex.shape))
    return out


def network_bound(model, inputs, precision: str) -> tuple[float, str]:
    """The bound a network compiled in `precision` is checked within, of its output's
    scale, and why: precision.py's network tolerance, or twice the error the precision's
    own rounding costs this model where that is larger (rounding error grows with depth
    and with how a network's random weights cancel). In bf16 that cost is PyTorch's own
    run of the model cast to bf16 (ResNet-18 0.016 of its output's scale, ResNet-50
    0.14); in tf32 and fp16, which PyTorch cannot run alike on a CPU, the model run in
    float32 with every GEMM's operands rounded as a tensor core rounds them
    (rounded_gemms). A model that cannot run so keeps the table's bound."""
    from raytune_kernels.precision import tolerance

    table = tolerance(precision).network
    if precision not in ("bf16", "tf32", "fp16"):
        return table, ""
    from torch.utils import _pytree as pytree

    try:
        with torch.no_grad():
            want = model(*inputs)
            if precision == "bf16":
                dtype = torch.bfloat16
                got = copy.deepcopy(model).to(dtype)(
                    *(x.to(dtype) if x.is_floating_point() else x for x in inputs))
                how = f"PyTorch's own {precision} gives this model"
            else:
                with rounded_gemms(precision):
                    got = model(*inputs)
                how = f"{precision}'s rounding of every GEMM operand gives this model"
        theirs = output_error(tuple(t.float() for t in pytree.tree_flatten(got)[0]
                                    if isinstance(t, torch.Tensor)), want)
    except Exception:  # an op without a kernel in that dtype here
        return table, ""
    if not 2 * theirs > table:
        return table, ""
    return 2 * theirs, f"twice the {theirs:.3g} {how}"


def held_to(err: float, model, inputs, precision: str,
            atol: float | None = None) -> tuple[float, str]:
    """The bound a network whose output is `err` off is checked within, and why: `atol`
    where the caller gives one; else the precision's table where `err` is within it, and
    only past it network_bound (which runs the model again, cast or rounded)."""
    from raytune_kernels.precision import tolerance

    if atol is not None:
        return atol, ""
    table = tolerance(precision).network
    return (table, "") if err <= table else network_bound(model, inputs, precision)


def rounded(x: torch.Tensor, precision: str) -> torch.Tensor:
    """x in float32, each value rounded as a tensor core's operand in `precision`: tf32
    to nearest with ties away from zero (cvt.rna), fp16 and bf16 to nearest even (cvt.rn;
    fp16 overflows to inf past 65504). Other dtypes pass unchanged."""
    if not x.is_floating_point():
        return x
    x = x.float()
    if precision == "fp16":
        return x.half().float()
    if precision == "bf16":
        return x.bfloat16().float()
    if precision != "tf32":
        raise ValueError(f"no tensor-core rounding for precision {precision!r}")
    bits = x.contiguous().view(torch.int32)
    # 13 of float32's 23 mantissa bits go: add half their unit to the magnitude (the
    # sign bit is untouched; a carry rounds up into the exponent), then clear them
    out = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x), out, x)


class rounded_gemms(torch.overrides.TorchFunctionMode):
    """Within it, convolutions (but depthwise ones), linear layers, matrix products and
    scaled_dot_product_attention round their operands with `rounded`, and compute and
    accumulate in float32, as a tensor-core kernel does; biases, softmax and everything
    else stay float32. What a network of tensor-core kernels costs in error, without a
    GPU."""

    # the positions of a function's two GEMM operands
    _CONV = {torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d,
             torch.conv_transpose2d, torch.conv_transpose3d}
    _OPERANDS = {**{f: (0, 1) for f in _CONV},
                 **{f: (0, 1) for f in (torch.nn.functional.linear, torch.matmul, torch.mm,
                                        torch.bmm, torch.Tensor.matmul, torch.Tensor.mm,
                                        torch.Tensor.bmm, torch.Tensor.__matmul__)},
                 **{f: (1, 2) for f in (torch.addmm, torch.baddbmm, torch.Tensor.addmm,
                                        torch.Tensor.baddbmm)}}

    def __init__(self, precision: str):
        super().__init__()
        rounded(torch.zeros(1), precision)  # an unknown precision fails here, not inside
        self.precision = precision

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        at = self._OPERANDS.get(func)
        if at is None or len(args) <= max(at) or self._depthwise(func, args, kwargs):
            return func(*args, **kwargs)
        args = list(args)
        for i in at:
            args[i] = rounded(args[i], self.precision)
        return func(*args, **kwargs)

    def _depthwise(self, func, args, kwargs) -> bool:  # a window kernel, not a GEMM
        groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
        return func in self._CONV and groups > 1 and args[1].shape[1] == 1

    def _attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False):
        f = torch.nn.functional.scaled_dot_product_attention
        if dropout_p:  # random: nothing to compare with
            return f(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                     enable_gqa=enable_gqa)
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
        r = lambda t: rounded(t, self.precision)  # noqa: E731
        s = r(q) @ r(k).transpose(-2, -1)
        s = s * (scale if scale is not None else q.shape[-1] ** -0.5)
        if is_causal:
            keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
            s = s.masked_fill(~keep, float("-inf"))
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
                else s + attn_mask
        return (r(torch.softmax(s, dim=-1)) @ r(v)).to(q.dtype)


def output_error(got, want) -> float:
    """The worst scaled_error over a network's outputs: `want` is what the model returned
    (a tensor, a tuple, a dict or a Hugging Face ModelOutput: flattened as capture flattens
    it, by torch's pytree), `got` the compiled network's tensor or tuple of tensors."""
    from torch.utils import _pytree as pytree

    wants = pytree.tree_flatten(want)[0]
    gots = list(got) if isinstance(got, (tuple, list)) else [got]
    if len(gots) != len(wants) or not all(isinstance(w, torch.Tensor) for w in wants):
        return math.nan  # the outputs do not even line up
    return worst(scaled_error(g, w) for g, w in zip(gots, wants))


def worst(errors) -> float:
    """The largest of several errors, NaN if any is (max() would pass over a NaN)."""
    errors = list(errors)
    return math.nan if any(math.isnan(e) for e in errors) else max(errors, default=0.0)


@dataclass
class ProfileRow:
    """One step: its time inside a running network (caches as the network leaves them),
    its time alone (repeated, as the records measure it), PyTorch's time for the same
    layer inside PyTorch's own run of the network, and what the plan expected."""

    name: str
    kind: str
    layers: tuple[str, ...]
    ours_s: float
    alone_s: float
    torch_s: float | None
    estimate_s: float
    # floating-point operations of the step's layer as its direct algorithm counts them (a
    # Winograd conv does fewer); 0 for transforms, glue, and where they are not counted
    flops: int = 0
    recorded: bool = False  # estimate_s is a record's time (not a model's, not untuned)

    @property
    def ratio(self) -> float | None:
        """PyTorch's time over ours: above 1, ours is faster."""
        return None if self.torch_s is None else self.torch_s / self.ours_s

    @property
    def flops_per_s(self) -> float | None:
        """The step's rate inside the network, where its operations are counted."""
        return self.flops / self.ours_s if self.flops and self.ours_s > 0 else None


@dataclass
class Profile:
    rows: list[ProfileRow]
    end_to_end_s: float
    torch_total_s: float = 0.0  # PyTorch's steps summed, run in sequence
    # the machine's peak floating-point operations per second at the network's threads
    # (FMA units x lanes x 2 x clock, from its measured model); None where not known
    peak_flops: float | None = None

    @property
    def total_s(self) -> float:
        return sum(r.ours_s for r in self.rows)

    @property
    def alone_s(self) -> float:
        return sum(r.alone_s for r in self.rows)

    def peak_share(self, r: ProfileRow) -> float | None:
        """A step's rate over the machine's peak (above 1 for an algorithm that does fewer
        operations than it is counted for, as Winograd does)."""
        rate = r.flops_per_s
        return rate / self.peak_flops if rate and self.peak_flops else None

    def table(self) -> str:
        """One line per step: its time in the network and alone, PyTorch's, the ratio,
        its share of the steps' sum, and, where its operations are counted, its rate
        (GFLOP/s) and that rate over the machine's peak."""
        total = self.total_s
        head = (f"{'step':<32} {'kind':<9} {'ours us':>8} {'alone us':>8} {'torch us':>8} "
                f"{'ratio':>6} {'share':>6} {'GFLOP/s':>8} {'peak':>5}")
        lines = [head, "-" * len(head)]
        for r in self.rows:
            torch_us = f"{r.torch_s * 1e6:8.1f}" if r.torch_s is not None else f"{'-':>8}"
            ratio = f"{r.ratio:6.2f}" if r.ratio is not None else f"{'-':>6}"
            rate, peak = r.flops_per_s, self.peak_share(r)
            rate_s = f"{rate / 1e9:8.1f}" if rate else f"{'-':>8}"
            peak_s = f"{peak:5.0%}" if peak is not None else f"{'-':>5}"
            flag = "  <- slower than torch" if r.ratio is not None and r.ratio < 1 else ""
            lines.append(f"{r.name[:32]:<32} {r.kind:<9} {r.ours_s * 1e6:8.1f} "
                         f"{r.alone_s * 1e6:8.1f} {torch_us} {ratio} "
                         f"{r.ours_s / total:6.1%} {rate_s} {peak_s}{flag}")
        kinds: dict[str, float] = {}
        for r in self.rows:
            kinds[r.kind] = kinds.get(r.kind, 0.0) + r.ours_s
        lines.append("-" * len(head))
        lines.append(f"steps in the network {total * 1e3:.3f} ms ("
                     + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in sorted(kinds.items()))
                     + f"), alone {self.alone_s * 1e3:.3f} ms; end to end "
                     f"{self.end_to_end_s * 1e3:.3f} ms; PyTorch's layers in its own run "
                     f"{self.torch_total_s * 1e3:.3f} ms")
        return "\n".join(lines)

    def save_png(self, path: str) -> str:
        """A bar chart of ours against PyTorch per step (matplotlib, the `plot` extra)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.rows if r.ours_s > 0]
        fig, ax = plt.subplots(figsize=(9, max(3.0, 0.28 * len(rows) + 1)))
        ys = np.arange(len(rows))
        ax.barh(ys - 0.2, [r.ours_s * 1e6 for r in rows], 0.4, label="ours")
        ax.barh(ys + 0.2, [(r.torch_s or 0) * 1e6 for r in rows], 0.4, label="PyTorch")
        ax.set_yticks(ys, [r.name[:40] for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("microseconds")
        ax.set_title(f"per-step time, end to end {self.end_to_end_s * 1e3:.2f} ms")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


class Reporting:
    """The fidelity report of a network that has `estimated_s` and `profile()`."""

    @property
    def planned_s(self) -> float | None:
        """What the layout plan expected of this network (None without a plan)."""
        plan = getattr(self, "plan", None)
        plan = getattr(plan, "layout_plan", plan)  # a GPU plan holds its layout plan
        return getattr(plan, "cost", None)

    def fidelity(self, measured_s: float, profile: Profile | None = None,
                 estimated_s: float | None = None) -> str:
        """The tuner's estimate next to the measured latency. Over a 10% gap, where it
        comes from: the steps the estimate leaves out (transforms, glue, torch), a machine
        that runs the recorded kernels slower or faster than their records (Drift), kernels
        slower in the network than in their records, and the difference between the steps
        timed alone and the network end to end (caches that repeated timing keeps warm)."""
        est = self.estimated_s if estimated_s is None else estimated_s
        gap = measured_s / est - 1 if est > 0 else math.inf
        lines = [f"estimated {est * 1e3:.3f} ms (sum of weight x best record), measured "
                 f"{measured_s * 1e3:.3f} ms end to end: {gap:+.1%}"]
        planned = self.planned_s
        if planned:
            lines.append(f"the layout plan expected {planned * 1e3:.3f} ms (the records of "
                         f"the kernels it chose, the transforms it priced): "
                         f"{measured_s / planned - 1:+.1%}")
        if abs(gap) <= 0.10:
            return "\n".join(lines)
        prof = profile or self.profile(print_table=False, with_torch=False,  # ours only
                                       end_to_end=measured_s)
        by_kind: dict[str, float] = {}
        for r in prof.rows:
            if r.kind != "kernel":
                by_kind[r.kind] = by_kind.get(r.kind, 0.0) + r.ours_s
        if by_kind:
            lines.append("not in the estimate: " + ", ".join(
                f"{k} steps {v * 1e3:.3f} ms" for k, v in sorted(by_kind.items())))
        drift = machine_drift(prof.rows)
        if drift is not None:
            lines.append(drift.line(est, measured_s))
        excess = sorted(((r.ours_s - r.estimate_s, r.name) for r in prof.rows
                         if r.kind == "kernel" and r.ours_s > r.estimate_s), reverse=True)
        if excess:
            lines.append("kernels slower in the network than in their records: " + "; ".join(
                f"{n} +{v * 1e6:.0f} us" for v, n in excess[:5]))
        lines.append(f"steps timed alone sum to {prof.alone_s * 1e3:.3f} ms, inside the "
                     f"network to {prof.total_s * 1e3:.3f} ms: "
                     f"{(prof.total_s - prof.alone_s) * 1e3:+.3f} ms from running them in "
                     "sequence (what each step leaves in the caches for the next)")
        return "\n".join(lines)


DRIFT = 0.15  # kernels alone this much off their records: the machine is not as tuned


@dataclass(frozen=True)
class Drift:
    """Each recorded kernel of the network timed alone here over its record, timed alike
    (alone, repeated, weights cold) where it was tuned. Their median far from 1 says the
    machine runs slower or faster than when it was tuned (another host of the same CPU
    name, another clock, neighbours on a shared host), a gap no plan can close. The
    median, not the sums: a kernel the in-network refinement chose can carry a record
    timed at a bad moment, many times its time anywhere since."""

    per_kernel: tuple[float, ...]  # each kernel's alone over its record, sorted

    @property
    def ratio(self) -> float:
        return statistics.median(self.per_kernel)

    def line(self, estimated_s: float, measured_s: float) -> str:
        scaled = estimated_s * self.ratio
        pace = "slower" if self.ratio > 1 else "faster"
        return (f"this machine runs the kernels {pace} than their records: each alone here "
                f"a median {self.ratio:.2f}x its record ({self.per_kernel[0]:.2f}-"
                f"{self.per_kernel[-1]:.2f}x over {len(self.per_kernel)} kernels): tuned on "
                f"another machine or at another load; the estimate at this pace "
                f"{scaled * 1e3:.3f} ms, measured {measured_s / scaled - 1:+.1%}")


def machine_drift(rows: Sequence[ProfileRow], threshold: float = DRIFT) -> Drift | None:
    """The Drift of the kernel rows that have a record, where its median is more than
    `threshold` off 1; None within it or with no such row."""
    ratios = sorted(r.alone_s / r.estimate_s for r in rows
                    if r.kind == "kernel" and r.recorded and r.estimate_s > 0 and r.alone_s > 0)
    if not ratios:
        return None
    drift = Drift(tuple(ratios))
    return drift if abs(drift.ratio - 1) > threshold else None
