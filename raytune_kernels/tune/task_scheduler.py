"""Allocation of tuning rounds among tasks (Ansor's gradient rule).

The objective is the estimated network latency, sum over tasks of weight x best latency.
After warm-up rounds for every task, each round goes to the task whose next round is
expected to lower the objective most: weight x (a mix of the recent improvement per round
and an optimistic 1/t forecast, best / rounds so far). With probability epsilon a random
task is taken instead. A task that has not improved for `patience` rounds, or whose space
is exhausted, is converged and gets no more rounds.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Collection

from raytune_kernels.task import Task


@dataclass
class TaskState:
    task: Task
    trials: int = 0
    rounds: int = 0
    best: float = math.inf
    history: list[float] = field(default_factory=list)  # best after each round
    stale: int = 0
    converged: bool = False


@dataclass(frozen=True)
class SchedulerOptions:
    warmup: int = 1
    epsilon: float = 0.05
    window: int = 3
    alpha: float = 0.2
    patience: int = 8


class TaskScheduler:
    def __init__(self, tasks: list[Task], seed: int = 0,
                 opts: SchedulerOptions = SchedulerOptions()):
        self.states = [TaskState(t) for t in tasks]
        self.opts, self.rng = opts, random.Random(seed)

    def objective(self) -> float:
        """Estimated latency in seconds (inf until every task has a valid time)."""
        return sum(s.task.weight * s.best for s in self.states)

    def active(self) -> list[int]:
        return [i for i, s in enumerate(self.states) if not s.converged]

    def next_task(self, busy: int | Collection[int] | None = None) -> int | None:
        """The task of the next round; None when none is left. `busy`, a task (or tasks)
        whose round is being measured, is not chosen (None when no other is left)."""
        busy = {busy} if isinstance(busy, int) else set(busy or ())
        active = [i for i in self.active() if i not in busy]
        if not active:
            return None
        warm = [i for i in active if self.states[i].rounds < self.opts.warmup]
        if warm:
            return warm[0]
        if self.rng.random() < self.opts.epsilon:
            return self.rng.choice(active)
        return max(active, key=self.gain)

    def gain(self, i: int) -> float:
        s = self.states[i]
        if not math.isfinite(s.best):
            return math.inf  # no valid time yet: the objective is unbounded until it has one
        h, w = s.history, self.opts.window
        backward = (h[-1 - w] - h[-1]) / w if len(h) > w and math.isfinite(h[-1 - w]) else 0.0
        forward = s.best / max(s.rounds, 1)
        return s.task.weight * (self.opts.alpha * backward + (1 - self.opts.alpha) * forward)

    def update(self, i: int, seconds: list[float], exhausted: bool = False) -> None:
        s = self.states[i]
        s.trials += len(seconds)
        s.rounds += 1
        new_best = min([s.best] + list(seconds))
        s.stale = 0 if new_best < s.best * (1 - 1e-3) else s.stale + 1
        s.best = new_best
        s.history.append(new_best)
        s.converged = exhausted or (math.isfinite(s.best) and s.stale >= self.opts.patience)

    def resume(self, i: int, seconds: list[float], warmed: bool = True) -> None:
        """Account measurements from an earlier run: trials and best, not rounds; the task
        counts as warmed up unless `warmed` is False (its first round is still owed)."""
        s = self.states[i]
        s.trials += len(seconds)
        s.best = min([s.best] + list(seconds))
        if seconds:
            s.history.append(s.best)
            if warmed:
                s.rounds = max(s.rounds, 1)
