"""Dashboard metrics: after every round the task scheduler actor, the process that knows
the numbers, records them through ray.util.metrics. Ray's metrics agent exports them on
each node's Prometheus endpoint (and so the dashboard's Metrics view) as
`ray_raytune_kernels_*` (counters with a `_total` suffix). The agent exports only with
Ray's full install (`ray[default]`); with the minimal one, recording goes nowhere.

What a round records is computed by a pure function (`readings`) from what the Tuner and
the pipeline already expose (RoundSummary, the round's records, PipelineStats), so that
it is tested without Ray's exporter; `TuningMetrics` keeps the little state between
rounds (the rate's window, the pipeline's figures at the last round) and records.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from raytune_kernels.tune.records import Record
from raytune_kernels.tune.result import RoundSummary

if TYPE_CHECKING:
    from actors.pipeline import PipelineStats

PREFIX = "raytune_kernels_"
TASK_TAGS = ("task", "compute")  # the task's key, and what it computes in words

# name (after PREFIX) -> (description, tag keys)
COUNTERS = {
    "trials": ("Trials measured, by task and result (ok, or the error kind)",
               TASK_TAGS + ("result",)),
    "errors": ("Trials that failed, by error kind", ("kind",)),
    "redone": ("Builds and measurements done again (a node lost, a measurer restarted, "
               "a host fault retried)", ()),
    "build_timeouts": ("Builds past the build timeout (their builders restarted)", ()),
}
GAUGES = {
    "trials_per_second": ("Trials measured per second over the last minute of rounds", ()),
    "best_latency_ms": ("Best measured latency of each task, in ms", TASK_TAGS),
    "best_gflops": ("GFLOP/s of each task's best kernel", TASK_TAGS),
    "estimated_latency_ms": ("Estimated network latency: sum of weight x best latency "
                             "(plus the PyTorch part), in ms", ()),
    "measurer_busy_fraction": ("Fraction of the measurers' time spent measuring while the "
                               "last round's batch ran", ()),
    "measurers": ("Measurers in the pipeline", ()),
    "budget_used_fraction": ("Trials spent over the trial budget (resumed ones included)", ()),
}


@dataclass(frozen=True)
class Reading:
    """One value to record: a counter's increment or a gauge's new value."""

    name: str  # after PREFIX
    value: float
    tags: tuple[tuple[str, str], ...] = ()


def readings(summary: RoundSummary, records: Sequence[Record], rate: float,
             before: "PipelineStats | None", now: "PipelineStats | None",
             torch_s: float = 0.0) -> tuple[list[Reading], list[Reading]]:
    """(counter increments, gauge values) for one round: `records` are its trials, `rate`
    its trials per second, `before` and `now` the pipeline's figures at the previous round
    and at this one. A latency not known yet (infinite) is left unset."""
    counts = _trial_counts(summary, records) + _pipeline_counts(before, now)
    gauges = _task_gauges(summary) + _pipeline_gauges(before, now)
    gauges.append(Reading("trials_per_second", rate))
    if summary.budget > 0:
        gauges.append(Reading("budget_used_fraction", summary.trials / summary.budget))
    if math.isfinite(summary.estimated_s):
        gauges.append(Reading("estimated_latency_ms", (summary.estimated_s + torch_s) * 1e3))
    return counts, gauges


def _task_tags(summary: RoundSummary) -> dict[str, tuple[tuple[str, str], ...]]:
    return {r.key: (("task", r.key), ("compute", r.compute)) for r in summary.rows}


def _trial_counts(summary: RoundSummary, records: Sequence[Record]) -> list[Reading]:
    tags = _task_tags(summary)
    trials = collections.Counter((r.task_key, r.error_kind or "ok") for r in records)
    errors = collections.Counter(r.error_kind for r in records if r.error_kind)
    return ([Reading("trials", n, tags.get(key, (("task", key), ("compute", ""))) +
                     (("result", result),)) for (key, result), n in sorted(trials.items())]
            + [Reading("errors", n, (("kind", kind),)) for kind, n in sorted(errors.items())])


def _task_gauges(summary: RoundSummary) -> list[Reading]:
    tags = _task_tags(summary)
    out = []
    for row in summary.rows:
        if math.isfinite(row.latency_s):
            out += [Reading("best_latency_ms", row.latency_s * 1e3, tags[row.key]),
                    Reading("best_gflops", row.gflops, tags[row.key])]
    return out


def _pipeline_counts(before: "PipelineStats | None",
                     now: "PipelineStats | None") -> list[Reading]:
    if now is None:
        return []
    return [Reading(name, getattr(now, name) - getattr(before, name, 0))
            for name in ("redone", "build_timeouts")]


def _pipeline_gauges(before: "PipelineStats | None",
                     now: "PipelineStats | None") -> list[Reading]:
    if now is None:
        return []
    out = [Reading("measurers", now.measurers)]
    wall = (now.wall_s - getattr(before, "wall_s", 0.0)) * now.measurers
    if wall > 0:  # no batch ran since the last reading: the last value stands
        busy = now.measure_busy_s - getattr(before, "measure_busy_s", 0.0)
        out.append(Reading("measurer_busy_fraction", min(1.0, max(0.0, busy / wall))))
    return out


class TrialRate:
    """Trials per second over the last `window_s` seconds of rounds (at least the last
    round): a run average would hide a slowdown late in a long run."""

    def __init__(self, window_s: float = 60.0):
        self.window_s = window_s
        self.points: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, elapsed_s: float, trials: int) -> float:
        self.points.append((elapsed_s, trials))
        while len(self.points) > 2 and self.points[1][0] <= elapsed_s - self.window_s:
            self.points.popleft()
        (t0, n0), (t1, n1) = self.points[0], self.points[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


class TuningMetrics:
    """Records the rounds of one tuning run; `torch_s` is the network's PyTorch part that
    the driver adds to the estimate (the progress table shows the same sum). Rounds
    closer than `every_s` seconds apart (a cluster of GPUs finishes dozens a second) are
    recorded together, at most once per `every_s`: their counts summed, the gauges as the
    latest round left them; `flush` records what is held back."""

    def __init__(self, torch_s: float = 0.0, window_s: float = 60.0, every_s: float = 1.0):
        self.torch_s, self.rate, self.every_s = torch_s, TrialRate(window_s), every_s
        self.stats: PipelineStats | None = None  # the pipeline's figures at the last record
        self.failed = False
        self._trials: collections.Counter = collections.Counter()  # held back
        self._latest: tuple | None = None  # (summary, rate, stats) of the latest round
        self._recorded_at = -math.inf  # the run's elapsed seconds at the last record

    def observe(self, summary: RoundSummary, records: Sequence[Record],
                stats: "PipelineStats | None" = None) -> None:
        if not self.rate.points:  # the run's start: its resumed trials measured no time
            self.rate.add(0.0, summary.trials - len(records))
        rate = self.rate.add(summary.elapsed_s, summary.trials)
        self._trials.update({(r.name, r.tags): r.value
                             for r in _trial_counts(summary, records)})
        self._latest = (summary, rate, stats)
        last = 0 < summary.budget <= summary.trials  # no later round would record it
        if last or summary.elapsed_s - self._recorded_at >= self.every_s:
            self._recorded_at = summary.elapsed_s
            self.flush()

    def flush(self) -> None:
        """Record what the rounds since the last record left: their trial counts, the
        pipeline's figures since then, the latest round's gauges."""
        if self._latest is None:
            return
        (summary, rate, stats), self._latest = self._latest, None
        counts, gauges = readings(summary, (), rate, self.stats, stats, self.torch_s)
        counts += [Reading(name, v, tags) for (name, tags), v in self._trials.items()]
        self._trials = collections.Counter()
        self.stats = dataclasses.replace(stats) if stats is not None else None
        if self.failed:
            return
        try:
            record(counts, gauges)
        except Exception as exc:  # the dashboard's loss: never a reason to stop tuning
            self.failed = True
            print(f"raytune_kernels metrics: recording stopped: {exc!r}", file=sys.stderr,
                  flush=True)  # the actor's log


def record(counts: Sequence[Reading], gauges: Sequence[Reading]) -> None:
    """Counters grow by their readings (zero is no news), gauges take theirs."""
    counters, meters = instruments()
    for r in counts:
        if r.value > 0:
            counters[r.name].inc(r.value, tags=dict(r.tags))
    for r in gauges:
        meters[r.name].set(r.value, tags=dict(r.tags))


@functools.cache
def instruments() -> tuple[dict, dict]:
    """The metric objects, made once per process: ray.util.metrics objects belong to the
    process that makes them, and a run's actor may be followed by another's in the same
    worker process."""
    from ray.util.metrics import Counter, Gauge

    return ({n: Counter(PREFIX + n, d, tag_keys=k) for n, (d, k) in COUNTERS.items()},
            {n: Gauge(PREFIX + n, d, tag_keys=k) for n, (d, k) in GAUGES.items()})
