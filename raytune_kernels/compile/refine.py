"""Each step's kernel chosen as the network runs it, not as it ran alone.

A record times a kernel called again and again: its input and output sit in the caches of
the cores that last touched them, which is the kernel itself. In the network the input was
just written by the producer, the output buffer last held some other value, and the step
before streamed its own data through the caches. How much a kernel loses to that depends
on its schedule (how often it reads its input, how it splits the loops between threads),
so the order of a task's records alone is not its order in the network: MobileNetV2's
depthwise convs run two to three times slower in the network than in their records.

refine() takes, for each step whose kernel came from records, the best few records of its
task that read and write the same layouts as the plan's choice (so every variant has the
same buffers and transforms), and second the plan's kernel with prefetching its weights
turned the other way where it has that knob (alternatives(twin=)), builds a network per rank (variant j runs each step's j-th
alternative, or its first where it has fewer), clocks every step inside each running
variant (CompiledNetwork._clock_steps: the cycle counter between the calls of one native
run), in interleaved rounds, and picks per step the kernel with the lowest median: the
plan's own, unless another is faster by more than MARGIN and faster in every round. With
many steps and alternatives some picks are noise, and a step's time also moves with its
neighbours' kernels; so the picked network is timed end to end against the plan's, in
interleaved rounds, and kept only where it runs faster by a third of MARGIN or more. Each
variant holds its own packed weights, so the number of variants alive at once is capped by
MEMORY_BYTES.

Before refine(), weigh_plans() puts the layout ILP's plan against the one-layout plan,
whole networks timed end to end, where the two differ: the ILP prices kernels and
transforms as each ran alone, and a plan that changes layouts often can lose more between
its steps than it saved. The faster plan is the one refined.

What a refinement kept is remembered per machine (`refine.jsonl` in the cache directory,
raytune_kernels/cache.py), keyed by the CPU and its ISA, llvmlite, the code that generates
and runs the kernels, the threads and every step's alternatives in rank order: compiling
the same records again (another process, the torch.compile backend) recalls the same
kernels at once instead of weighing them again, so two compiles of one model agree.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import pathlib
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from raytune_kernels.cache import cache_dir, code_fingerprint
from raytune_kernels.compile.choose import TORCH
from raytune_kernels.frontend.partition import Partition, TaskStep
from raytune_kernels.layout.graph import Candidate
from raytune_kernels.space import KNOB_DEFAULTS, Config
from raytune_kernels.tune.records import Record

MARGIN = 0.03  # an alternative replaces the plan's kernel when faster by more than this
MEMORY_BYTES = 1 << 30  # packed weights of all variants alive at once
ROUNDS = 3
BUDGET_S = 2.0  # clocking time aimed at, all variants and rounds together
CONFIRM_ROUNDS = 7


@dataclass
class Refined:
    """What refine() did: the alternatives it weighed and what it changed."""

    variants: int = 0  # networks built and clocked (1: nothing to weigh)
    steps: int = 0  # steps that had alternatives
    changed: list[str] = field(default_factory=list)  # steps now running another record
    # of those, the steps whose new kernel differs from the plan's in one knob: knob -> count
    turned: dict[str, int] = field(default_factory=dict)
    before_s: float = 0.0  # the clocked steps' sum with the plan's kernels
    after_s: float = 0.0  # ... with the kernels picked, as clocked in their variants
    speedup: float | None = None  # the plan's network over the picked one's, end to end
    seconds: float = 0.0  # wall time of refine()
    recalled: bool = False  # the picks came from this machine's cache, weighed earlier

    def describe(self) -> str:
        if self.variants < 2:
            return "in-network refinement: no step had another record of its layouts"
        head = f"in-network refinement: {self.variants} variants"
        clocked = (f"steps clocked {self.before_s * 1e3:.3f} -> {self.after_s * 1e3:.3f} ms, "
                   f"in {self.seconds:.1f} s")
        if self.recalled:
            clocked = "recalled: weighed by an earlier compile of these records on this machine"
        if self.speedup is None:
            return f"{head}, no step ran faster on another record; {clocked}"
        turned = "".join(f", {n} only in {k}" for k, n in sorted(self.turned.items()))
        verdict = (f"{len(self.changed)} of {self.steps} steps changed{turned}" if self.changed
                   else "the picks kept none")
        return (f"{head}, {verdict} (end to end {self.speedup:.3f}x the plan's network); "
                f"{clocked}")


def alternatives(part: Partition, chosen: Sequence[Candidate], records: Sequence[Record],
                 layouts: Callable, threads: int, most: int,
                 bordered: Callable[[TaskStep, Candidate], bool],
                 twin: Callable | None = None) -> dict[int, list[Candidate]]:
    """Per step index: the plan's candidate, then up to most - 1 other records of its task
    (fastest first, at `threads` threads) with the same input and output layouts, the same
    bordered output, and a config of their own. Steps whose choice is not a record's (torch,
    untuned) or that have no other record are left out.

    With `twin` (compute, config -> config or None: the same kernel with one knob that
    changes neither layouts nor values turned the other way), the plan's twin comes second,
    timed as its record says or, where none was measured, at the plan's estimate: a knob
    whose gain depends on what the network leaves in the caches (prefetching weights) is
    weighed where it runs."""
    by_task: dict[str, list[Record]] = {}
    for r in records:
        if r.ok and r.threads == threads:
            by_task.setdefault(r.task_key, []).append(r)
    for rs in by_task.values():
        rs.sort(key=lambda r: r.median)
    out: dict[int, list[Candidate]] = {}
    for i, (step, cand) in enumerate(zip(part.steps, chosen)):
        if not isinstance(step, TaskStep) or cand.config in (None, TORCH) or \
                step.key not in by_task:
            continue
        task = part.task(step.key)
        keep, seen = [cand], {cand.config}
        ranked = [(Config.from_json(r.config), r.median) for r in by_task[step.key]]
        other = twin(task.compute, cand.config) if twin is not None else None
        if other is not None and most > 1:
            timed = next((t for cfg, t in ranked if cfg == other), cand.seconds)
            keep.append(Candidate(cand.in_layout, cand.out_layout, timed, other))
            seen.add(other)
        for cfg, median in ranked:
            if len(keep) >= most:
                break
            if cfg in seen:
                continue
            seen.add(cfg)
            alt = Candidate(*layouts(task, cfg), median, cfg)
            if (alt.in_layout, alt.out_layout) == (cand.in_layout, cand.out_layout) and \
                    bordered(step, alt) == bordered(step, cand):
                keep.append(alt)
        if len(keep) > 1:
            out[i] = keep
    return out


def variant_count(alts: dict[int, list[Candidate]], most: int, weight_bytes: int) -> int:
    """How many variants to build: the most alternatives any step has, capped so that
    their packed weights fit MEMORY_BYTES (at least 1)."""
    wanted = max((len(a) for a in alts.values()), default=1)
    fit = MEMORY_BYTES // max(weight_bytes, 1)
    return max(1, min(wanted, most, fit))


def variant(chosen: Sequence[Candidate], alts: dict[int, list[Candidate]], j: int
            ) -> list[Candidate]:
    """The plan with every step that has a j-th alternative running it."""
    out = list(chosen)
    for i, a in alts.items():
        if j < len(a):
            out[i] = a[j]
    return out


def task_positions(part: Partition, net) -> dict[int, int]:
    """Partition step index -> index of the network step that runs its kernel (the steps of
    one task follow the plan's order; transforms, fills and glue carry no task key)."""
    tasks = [i for i, s in enumerate(part.steps) if isinstance(s, TaskStep)]
    runs = [k for k, s in enumerate(net.steps) if s.key is not None and s.kind != "glue"]
    if len(tasks) != len(runs) or any(part.steps[i].key != net.steps[k].key
                                      for i, k in zip(tasks, runs)):
        raise ValueError("the network's steps do not follow the plan's tasks")
    return dict(zip(tasks, runs))


def refine(part: Partition, chosen: Sequence[Candidate], alts: dict[int, list[Candidate]],
           assemble: Callable[[list[Candidate]], object], inputs: Sequence[torch.Tensor],
           variants: int, prebuild: Callable[[list[tuple[str, Config]]], set] | None = None,
           rounds: int = ROUNDS, budget_s: float = BUDGET_S, key: str | None = None
           ) -> tuple[list[Candidate], Refined, object | None]:
    """The plan with each step in `alts` running the alternative that clocks fastest inside
    the running network (module docstring), the report, and the plan's network where
    refine assembled it (None: assemble it); `assemble(chosen)` builds an unchecked
    network, `prebuild` the kernels of (task key, config) pairs ahead (in parallel) and
    returns the pairs that failed to build. With `key` (decision_key), a refinement this
    machine kept under it is recalled, and what this one keeps is remembered."""
    start = time.perf_counter()
    report = Refined(variants=1, steps=len(alts))
    if variants < 2 or not alts:
        report.seconds = time.perf_counter() - start
        return list(chosen), report, None
    given = alts  # ranks are remembered in these lists, before any is dropped below
    kept = recall(key, alts) if key is not None else None
    if kept is not None:
        out = list(chosen)
        for i, rank in kept["picks"]:
            out[i] = alts[i][rank]
        report.variants, report.speedup, report.recalled = kept["variants"], kept["speedup"], True
        report.changed = [part.steps[i].layer for i, _ in kept["picks"]]
        report.turned = _turned(chosen, out, [i for i, _ in kept["picks"]])
        report.seconds = time.perf_counter() - start
        return out, report, None
    if prebuild is not None:  # an alternative that does not build is no alternative
        failed = prebuild(list(dict.fromkeys((part.steps[i].key, c.config)
                                             for i, a in alts.items() for c in a[:variants])))
        alts = {i: left for i, a in alts.items()
                if len(left := [a[0]] + [c for c in a[1:]
                                         if (part.steps[i].key, c.config) not in failed]) > 1}
        report.steps = len(alts)
        if not alts:
            report.seconds = time.perf_counter() - start
            return list(chosen), report, None
        variants = min(variants, max(len(a) for a in alts.values()))
    current, plan_net, report.before_s, report.after_s = _weigh(
        part, list(chosen), alts, assemble, list(inputs), variants, rounds, budget_s)
    report.variants = variants
    changed = [i for i in alts if current[i].config != chosen[i].config]
    net = plan_net
    if changed:
        picked = assemble(current)
        report.speedup = _confirm(plan_net, picked, list(inputs), budget_s)
        if report.speedup < 1 + MARGIN / 3:
            current, changed = list(chosen), []
        else:
            net, report.changed = picked, [part.steps[i].layer for i in changed]
            report.turned = _turned(chosen, current, changed)
    if key is not None:
        remember(key, [(i, next(r for r, c in enumerate(given[i])
                                if c.config == current[i].config)) for i in changed],
                 report.variants, report.speedup)
    report.seconds = time.perf_counter() - start
    return current, report, net


def _turned(chosen: Sequence[Candidate], picked: Sequence[Candidate], changed) -> dict:
    """knob -> how many of the `changed` steps picked a kernel that differs from the
    plan's in that knob alone (a config without the knob counting as its default)."""
    out: dict[str, int] = {}
    for i in changed:
        if not (isinstance(chosen[i].config, Config) and isinstance(picked[i].config, Config)):
            continue
        a, b = dict(chosen[i].config.knobs), dict(picked[i].config.knobs)
        value = lambda knobs, k: knobs.get(k, KNOB_DEFAULTS.get(k))  # noqa: E731
        differ = [k for k in set(a) | set(b) if value(a, k) != value(b, k)]
        if len(differ) == 1:
            out[differ[0]] = out.get(differ[0], 0) + 1
    return out


# ------------------------------------------------- threads agreeing on what they split

# the loops whose split hands each thread a band of the output's rows (pixel tiles run in
# row order): a consumer that splits its rows as well finds most of its input in the
# cache of the core that wrote it
ROW_AXES = ("oh", "pt")


def split_axis(config) -> str | None:
    """The loop a kernel's threads split first (the first of its config's spatial_order;
    None for kernels without one: row kernels, denses, transforms)."""
    order = config.get("spatial_order") if isinstance(config, Config) else None
    return order[0] if order else None


@dataclass
class Agreed:
    """What agree() did: the steps it could make split rows and what it kept; joined()
    adds a second agreement's (the plan's own kernels reordered) as `reordered`."""

    steps: int = 0  # steps with a record of their layouts that splits rows first
    kept: int = 0  # of those, the steps now running it
    speedup: float | None = None  # the given plan's network over the kept one's
    seconds: float = 0.0
    recalled: bool = False
    reordered: int = 0  # steps then offered their own kernel splitting rows first
    reordered_kept: int = 0  # of those, the steps now running it

    def joined(self, then: "Agreed") -> "Agreed":
        """This agreement followed by `then`, which weighed the plan's kernels reordered
        (rows_first_twin) on the plan this one kept: one report of both."""
        speedups = [a.speedup for a in (self, then) if a.kept and a.speedup is not None]
        return Agreed(self.steps, self.kept, math.prod(speedups) if speedups else None,
                      self.seconds + then.seconds,
                      all(a.recalled for a in (self, then) if a.steps),
                      then.steps, then.kept)

    def describe(self) -> str:
        if not self.steps and not self.reordered:
            return "split agreement: every kernel already splits rows, or none can"
        head = f"split agreement: {self.steps} steps could split rows first"
        kept = f"{self.kept}"
        if self.reordered:
            head += f" by a record, {self.reordered} by their own kernel reordered"
            kept += f" and {self.reordered_kept}"
        when = ("recalled: weighed by an earlier compile of these records on this machine"
                if self.recalled else f"in {self.seconds:.1f} s")
        if not self.kept and not self.reordered_kept:
            return f"{head}; the plan's splits kept, {when}"
        return f"{head}, {kept} now do (end to end {self.speedup:.3f}x the plan's network); {when}"


def row_alternatives(part: Partition, chosen: Sequence[Candidate],
                     records: Sequence[Record], layouts: Callable, threads: int,
                     bordered: Callable[[TaskStep, Candidate], bool],
                     twin: Callable[[TaskStep, Config], Config | None] | None = None
                     ) -> dict[int, list[Candidate]]:
    """Per step whose kernel splits something other than rows first (ROW_AXES): [the
    plan's candidate, its task's fastest record at `threads` with the same layouts and
    bordered output that splits rows first], or where no record does, the plan's own
    kernel with its loops reordered to split rows first (`twin`, timed as the plan's:
    the weighing measures it); steps with neither are left out."""
    by_task: dict[str, list[Record]] = {}
    for r in records:
        if r.ok and r.threads == threads:
            by_task.setdefault(r.task_key, []).append(r)
    out: dict[int, list[Candidate]] = {}
    for i, (step, cand) in enumerate(zip(part.steps, chosen)):
        if not isinstance(step, TaskStep) or cand.config in (None, TORCH) or \
                split_axis(cand.config) in (None, *ROW_AXES):
            continue
        task = part.task(step.key)
        for r in sorted(by_task.get(step.key, ()), key=lambda r: r.median):
            cfg = Config.from_json(r.config)
            if split_axis(cfg) not in ROW_AXES:
                continue
            alt = Candidate(*layouts(task, cfg), r.median, cfg)
            if (alt.in_layout, alt.out_layout) == (cand.in_layout, cand.out_layout) and \
                    bordered(step, alt) == bordered(step, cand):
                out[i] = [cand, alt]
                break
        else:
            cfg = twin(step, cand.config) if twin is not None else None
            if cfg is not None:
                out[i] = [cand, dataclasses.replace(cand, config=cfg)]
    return out


def agree(part: Partition, chosen: Sequence[Candidate], rows: dict[int, list[Candidate]],
          assemble: Callable[[list[Candidate]], object], inputs: Sequence[torch.Tensor],
          prebuild: Callable[[list[tuple[str, Config]]], set] | None = None,
          rounds: int = ROUNDS, budget_s: float = BUDGET_S / 2, key: str | None = None,
          net: object | None = None, networks: int = 3
          ) -> tuple[list[Candidate], Agreed, object | None]:
    """The plan with the steps of `rows` (row_alternatives) splitting rows first, where the
    network runs faster so, and the report, and the network of what it returns where it
    built one (None: assemble it); `net`: the plan's network where the caller has it;
    `networks`: how many networks' packed weights may be alive at once (the plan's
    included; under 2, nothing is weighed).

    A kernel that splits its output's channels between the threads hands the next one,
    which splits rows (or reduces over every channel, as a 1x1 conv does), half its input
    in the other core's cache; read from there it can take twice as long as in its
    record, where its input sits in the cache of the core that reads it. A step's own
    time does not show this: its consumer pays. So the weighing is of whole networks:
    the plan, every step of `rows` splitting rows first, and that with the steps whose
    own clocked time rose by more than MARGIN in every round going back to the plan's
    kernel; the fastest end to end is kept where it runs faster than the plan by a third
    of MARGIN (interleaved rounds, as refine confirms). It runs after refine, on a plan
    whose kernels were already weighed as they run, so it clocks and confirms on half of
    refine's budget each. With `key`, a choice this machine made under it is recalled,
    and this one remembered."""
    start = time.perf_counter()
    report = Agreed(steps=len(rows))
    if not rows or networks < 2:
        return list(chosen), report, None
    if key is not None and (kept := recall(key, rows)) is not None:
        out = variant(chosen, {i: rows[i] for i, _ in kept["picks"]}, 1)
        report.kept, report.speedup, report.recalled = len(kept["picks"]), kept["speedup"], True
        report.seconds = time.perf_counter() - start
        return out, report, None
    if prebuild is not None:
        failed = prebuild([(part.steps[i].key, a[1].config) for i, a in rows.items()])
        rows = {i: a for i, a in rows.items() if (part.steps[i].key, a[1].config) not in failed}
        if not rows:
            report.seconds = time.perf_counter() - start
            return list(chosen), report, None
    xs = list(inputs)
    plan_net = net if net is not None else assemble(list(chosen))
    every = assemble(variant(chosen, rows, 1))
    laps = _clock_rounds([plan_net, every], xs, rounds, budget_s)
    where = [task_positions(part, n) for n in (plan_net, every)]
    slower = [i for i in rows if np.all(laps[1][:, where[1][i]] >
                                        laps[0][:, where[0][i]] * (1 + MARGIN))]
    tries = {tuple(rows): every}
    if slower and len(slower) < len(rows) and networks >= 3:
        some = tuple(i for i in rows if i not in slower)
        tries[some] = assemble(variant(chosen, {i: rows[i] for i in some}, 1))
    speedups = {picks: _confirm(plan_net, n, xs, budget_s) for picks, n in tries.items()}
    picks = max(speedups, key=speedups.get)
    out, net = list(chosen), plan_net
    if speedups[picks] >= 1 + MARGIN / 3:
        out, net = variant(chosen, {i: rows[i] for i in picks}, 1), tries[picks]
        report.kept, report.speedup = len(picks), speedups[picks]
    if key is not None:
        remember(key, [(i, 1) for i in picks] if report.kept else [], 2, report.speedup)
    report.seconds = time.perf_counter() - start
    return out, report, net


@dataclass
class Weighed:
    """What weigh_plans() did: the layout ILP's plan against the one-layout plan."""

    steps: int = 0  # steps whose kernel or layouts differ between the two plans
    speedup: float | None = None  # the ILP plan's network time over the one-layout plan's
    kept: bool = False  # the one-layout plan runs
    seconds: float = 0.0
    recalled: bool = False

    def when(self) -> str:
        return ("recalled: weighed by an earlier compile of these records on this machine"
                if self.recalled else f"in {self.seconds:.1f} s")

    def describe(self) -> str:
        if not self.steps:
            return "layouts weighed: the ILP's plan is the one-layout plan"
        head = f"layouts weighed: the one-layout plan differs in {self.steps} steps"
        when = self.when()
        if self.speedup is None:
            return f"{head}, and not all of its kernels build: the ILP's plan kept, {when}"
        kept = "the one-layout plan kept" if self.kept else "the ILP's plan kept"
        return (f"{head}; it ran {self.speedup:.3f}x the ILP's plan's speed end to end: "
                f"{kept}, {when}")


@dataclass
class NhwcReads(Weighed):
    """What weigh_plans() did with the plan whose convs read their NHWC inputs as they are
    (compile/cpu_plan.nhwc_reads): `kept`, that plan runs."""

    def describe(self) -> str:
        if not self.steps:
            return "NHWC reads: no conv reads an NHWC value through a copy"
        head = (f"NHWC reads: {self.steps} step(s) change so that convs read NHWC values "
                "without a copy")
        if self.speedup is None:
            return f"{head}, but not all of those kernels build: the copies kept, {self.when()}"
        kept = "they do" if self.kept else "the copies kept"
        return (f"{head}; so the network ran {self.speedup:.3f}x as fast end to end: {kept}, "
                f"{self.when()}")


def differences(chosen: Sequence[Candidate], other: Sequence[Candidate]
                ) -> dict[int, list[Candidate]]:
    """step index -> [chosen's candidate, other's], where they differ in layouts or kernel."""
    return {i: [a, b] for i, (a, b) in enumerate(zip(chosen, other))
            if (a.in_layout, a.out_layout, a.config) != (b.in_layout, b.out_layout, b.config)}


def weigh_plans(part: Partition, chosen: Sequence[Candidate], other: Sequence[Candidate],
                assemble: Callable[[list[Candidate]], object], inputs: Sequence[torch.Tensor],
                prebuild: Callable[[list[tuple[str, Config]]], set] | None = None,
                budget_s: float = BUDGET_S / 2, key: str | None = None,
                report: Weighed | None = None) -> tuple[list[Candidate], Weighed]:
    """The layout ILP's plan (`chosen`) or the one-layout plan (`other`), whichever runs
    faster end to end, and the report. The ILP prices each kernel as its record timed it
    alone and each transform as timed alone; run in sequence, a plan of many layouts can
    lose more to the caches between steps than its transforms were priced at, and come
    out slower than keeping one layout. So where the two plans differ both networks are
    built and timed in interleaved rounds (refine's confirmation), and the one-layout plan
    replaces the ILP's where it runs faster by a third of MARGIN or more. With `key`
    (decision_key over the differing steps), a choice this machine made under it is
    recalled, and this one remembered. Any other pair of plans is weighed alike, `other`
    the change that must earn its place; `report` (a Weighed) names what they are."""
    start = time.perf_counter()
    differ = differences(chosen, other)
    report = report if report is not None else Weighed()
    report.steps = len(differ)
    if not differ:
        return list(chosen), report
    if key is not None and (kept := recall(key, differ)) is not None:
        report.kept, report.speedup, report.recalled = bool(kept["picks"]), kept["speedup"], True
        report.seconds = time.perf_counter() - start
        return list(other if report.kept else chosen), report
    if prebuild is not None:
        pairs = [(part.steps[i].key, b.config) for i, (_, b) in differ.items()
                 if isinstance(part.steps[i], TaskStep) and b.config not in (None, TORCH)]
        if prebuild(list(dict.fromkeys(pairs))):
            report.seconds = time.perf_counter() - start
            return list(chosen), report
    xs = list(inputs)
    report.speedup = _confirm(assemble(list(chosen)), assemble(list(other)), xs, budget_s)
    report.kept = report.speedup >= 1 + MARGIN / 3
    if key is not None:
        remember(key, [(i, 1) for i in differ] if report.kept else [], 2, report.speedup)
    report.seconds = time.perf_counter() - start
    return list(other if report.kept else chosen), report


def _clock_rounds(nets: list, xs: list[torch.Tensor], rounds: int, budget_s: float
                  ) -> list[np.ndarray]:
    """Per network: its steps clocked inside it (round x step seconds), the networks taking
    turns each round, in alternating order."""
    once = min(_seconds_per_run(n, xs) for n in nets)
    runs = int(min(50, max(5, budget_s / max(once * rounds * len(nets), 1e-6))))
    laps: list[list[np.ndarray]] = [[] for _ in nets]
    for r in range(rounds):
        for j in (range(len(nets)) if r % 2 == 0 else reversed(range(len(nets)))):
            laps[j].append(np.asarray(nets[j]._clock_steps(xs, runs)))
    return [np.stack(lap) for lap in laps]


# ------------------------------------------------------------- what this machine kept

# the code a refinement's outcome depends on: the kernels, how they are built and run
SOURCES = ("cpu", "compile/refine.py", "compile/cpu_plan.py", "compile/cpu_network.py")


@functools.cache
def fingerprint() -> str:
    """The machine and our kernel code: CPU name and ISA, llvmlite, the SOURCES."""
    import llvmlite

    from raytune_kernels.cpu.machine import host_device

    return code_fingerprint([*host_device(), llvmlite.__version__], SOURCES)


def decision_key(part: Partition, chosen: Sequence[Candidate],
                 alts: dict[int, list[Candidate]], threads: int, kind: str = "refine") -> str:
    """What a refinement's (or, with kind="agree" or "layouts", a split agreement's or a
    layout weighing's) outcome depends on besides the moment: the machine and code
    (fingerprint), the threads, the plan (every step's task, layouts and kernel) and every
    step's alternatives in rank order."""
    plan = [[getattr(step, "key", None), c.in_layout, c.out_layout, _config_json(c.config)]
            for step, c in zip(part.steps, chosen)]
    steps = [[i, [_config_json(c.config) for c in a]] for i, a in sorted(alts.items())]
    text = json.dumps([kind, fingerprint(), threads, MARGIN, plan, steps], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _config_json(config) -> object:
    """A plan step's kernel as JSON: a config's knobs, or TORCH / None as they are."""
    return config.to_json() if isinstance(config, Config) else config


def _cache_file() -> pathlib.Path | None:
    d = cache_dir()
    return None if d is None else d / "refine.jsonl"


def recall(key: str, alts: dict[int, list[Candidate]]) -> dict | None:
    """What this machine kept under `key` (the last line for it), if its picks still name
    alternatives of these steps; lines that do not parse are ignored (a cache)."""
    path = _cache_file()
    if path is None or not path.exists():
        return None
    found = None
    with open(path, errors="replace") as f:
        for line in f:
            try:
                d = json.loads(line)
                if d["key"] != key:
                    continue
                picks = [(int(i), int(r)) for i, r in d["picks"]]
                if all(i in alts and 0 < r < len(alts[i]) for i, r in picks):
                    found = {"picks": picks, "variants": int(d["variants"]),
                             "speedup": None if d["speedup"] is None else float(d["speedup"])}
            except (ValueError, KeyError, TypeError):
                continue
    return found


def remember(key: str, picks: list[tuple[int, int]], variants: int,
             speedup: float | None) -> None:
    """Append what a refinement kept (step index, rank); a cache that cannot be written
    is skipped: it only saves time."""
    path = _cache_file()
    if path is None:
        return
    line = json.dumps({"key": key, "picks": picks, "variants": variants, "speedup": speedup})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError:
        return


def _confirm(plan, refined, xs: list[torch.Tensor], budget_s: float) -> float:
    """The plan's network's time over the refined one's, end to end: the median over
    CONFIRM_ROUNDS interleaved rounds of the ratio of their median call times."""
    once = max(_seconds_per_run(plan, xs), 1e-6)
    calls = int(min(100, max(5, budget_s / (once * 2 * CONFIRM_ROUNDS))))
    ratios = []
    for r in range(CONFIRM_ROUNDS):
        pair = (plan, refined) if r % 2 == 0 else (refined, plan)
        took = {id(n): _median_call(n, xs, calls) for n in pair}
        ratios.append(took[id(plan)] / took[id(refined)])
    return float(np.median(ratios))


def _median_call(net, xs: list[torch.Tensor], calls: int) -> float:
    net(*xs)
    took = []
    for _ in range(calls):
        t = time.perf_counter()
        net(*xs)
        took.append(time.perf_counter() - t)
    return float(np.median(took))


def _weigh(part: Partition, chosen: list[Candidate], alts: dict[int, list[Candidate]],
           assemble: Callable, xs: list[torch.Tensor], variants: int, rounds: int,
           budget_s: float) -> tuple[list[Candidate], object, float, float]:
    """The clocking and the picks of refine(): (the plan it picks, the network of `chosen`
    it built and clocked, the clocked sum of its steps, that sum with the picked kernels'
    clocked times)."""
    nets = [assemble(variant(chosen, alts, j)) for j in range(variants)]
    where = [task_positions(part, n) for n in nets]
    step_s = _clock_rounds(nets, xs, rounds, budget_s)  # per variant: round x step
    out = list(chosen)
    before_s = after_s = float(np.median(step_s[0], axis=0).sum())
    for i, a in alts.items():
        took = [step_s[j][:, where[j][i]] for j in range(min(len(a), len(nets)))]
        best = min(range(len(took)), key=lambda j: float(np.median(took[j])))
        gain = float(np.median(took[best]) - np.median(took[0]))
        # faster by the margin, and in every round: not one lucky round against the plan
        if best and gain < -MARGIN * float(np.median(took[0])) and \
                bool(np.all(took[best] < took[0])):
            out[i] = a[best]
            after_s += gain
    return out, nets[0], before_s, after_s


def _seconds_per_run(net, xs: list[torch.Tensor]) -> float:
    """One call of the network, the fastest of three after one to warm up."""
    net(*xs)
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        net(*xs)
        best = min(best, time.perf_counter() - t)
    return best

