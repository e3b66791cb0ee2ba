"""What tuning reports: the task table after each round (RoundSummary, what the progress
view and callbacks see), a point of the tuning curve per round, and the result of a run,
which also reads as pandas dataframes (tune/frames.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from raytune_kernels.task import Task
from raytune_kernels.tune.records import Record


@dataclass(frozen=True)
class TaskRow:
    id: int
    key: str
    compute: str
    weight: int
    trials: int
    latency_s: float
    gflops: float


@dataclass(frozen=True)
class RoundPoint:
    """Where one round left the run: the curve of estimated latency against trials."""

    round: int
    task_key: str  # the task the round measured
    trials: int  # spent so far, resumed ones included
    elapsed_s: float
    estimated_s: float
    valid: int
    errors: dict[str, int]


@dataclass(frozen=True)
class RoundSummary:
    round: int
    task_id: int
    rows: tuple[TaskRow, ...]
    estimated_s: float
    trials: int
    budget: int
    elapsed_s: float
    valid: int
    errors: dict[str, int]
    torch_s: float = 0.0  # of estimated_s, the part that runs PyTorch (islands, no kernel)

    def point(self) -> RoundPoint:
        return RoundPoint(self.round, self.rows[self.task_id].key, self.trials,
                          self.elapsed_s, self.estimated_s, self.valid, dict(self.errors))


@dataclass
class TuningResult:
    """Per-task best records, the estimated network latency, the records path.

    The estimate is the sum of weight x best record over the tuned tasks, plus `torch_s`:
    the measured PyTorch time of what runs PyTorch in the compiled network (islands, tasks
    with no kernel on this target), when the driver measured it. `task_trials` and
    `task_errors` count every trial of a task that the run took into account (resumed
    ones included); `rounds` holds this run's rounds. `setup` says how a run through Ray
    was laid out: measurers, nodes, whether rounds streamed, the search actors' nodes."""

    best: dict[str, Record]
    estimated_latency_s: float
    records: str | None
    trials: int
    tasks: list[Task] = field(default_factory=list)
    torch_s: float = 0.0
    rounds: list[RoundPoint] = field(default_factory=list)
    task_trials: dict[str, int] = field(default_factory=dict)
    task_errors: dict[str, dict[str, int]] = field(default_factory=dict)
    setup: dict = field(default_factory=dict)

    def to_dataframe(self):
        """One row per tuned task: key, compute, layers, weight, trials, best_ms, gflops
        and errors_<kind> counts (pandas: pip install pandas)."""
        from raytune_kernels.tune.frames import task_frame

        return task_frame(self)

    def curve_dataframe(self):
        """One row per round of this run: round, task_key, trials, elapsed_s,
        estimated_ms (NaN until every task has a valid time), valid, errors_<kind>."""
        from raytune_kernels.tune.frames import round_frame

        return round_frame(self.rounds)
