"""Tuning curves read from records: each task's best time against that task's own trials,
and the estimated network latency against all trials. The plot and the records dataframe
both take them from here, so a figure and a table of the same file agree."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Point:
    """Where one record leaves the curves."""

    index: int          # the record's position in the list given
    trial: int          # 1-based, over every task, in the order measured
    task_trial: int     # 1-based, within the record's task
    elapsed_s: float    # since the first record
    task_best_s: float  # the task's best so far; inf until one of its records is valid
    estimated_s: float  # sum of weight x best so far over the tasks with a valid record
                        # (inf until one record is valid)


def curves(records: Sequence, weights: Mapping[str, int] | None = None) -> list[Point]:
    """One point per record, in the order measured (by timestamp; records without one keep
    their order in the list). `weights` (task key -> how many layers share the task) makes
    the sum the tuner's estimate; a task missing from it counts 0. Without it every task
    counts once."""
    order = sorted(range(len(records)), key=lambda i: records[i].timestamp)
    start = records[order[0]].timestamp if order else 0.0
    best: dict[str, float] = {}
    seen: dict[str, int] = {}
    total, out = math.inf, []
    for trial, i in enumerate(order, 1):
        r = records[i]
        seen[r.task_key] = seen.get(r.task_key, 0) + 1
        if r.ok and r.median < best.get(r.task_key, math.inf):
            best[r.task_key] = r.median
            total = sum(b * (1 if weights is None else weights.get(k, 0))
                        for k, b in best.items())
        out.append(Point(i, trial, seen[r.task_key], r.timestamp - start,
                         best.get(r.task_key, math.inf), total))
    return out
