"""Tuning curves of records as a PNG (matplotlib, the `plot` extra): each task's best
latency against that task's trials and against wall time, and the estimated network
latency against all trials and wall time. The points are those of tune/curves.py, the
same as the records dataframe's columns."""
from __future__ import annotations

import math
from typing import Mapping

from raytune_kernels.tune.curves import Point, curves
from raytune_kernels.tune.records import load_records
from raytune_kernels.tune.storage import redact


def task_lines(records, points: list[Point]) -> dict[str, list[Point]]:
    """Per task key, its points from its first valid record on (the line drawn for it)."""
    lines: dict[str, list[Point]] = {}
    for p in points:
        if math.isfinite(p.task_best_s):
            lines.setdefault(records[p.index].task_key, []).append(p)
    return lines


def plot_records(path: str, out: str, weights: Mapping[str, int] | None = None) -> str:
    """Draw the curves of the records at `path` into the PNG `out`; returns `out`. With
    `weights` (task key -> weight, from the model's tasks) only those tasks are drawn and
    the total is the tuner's estimate; without, every task counts once."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'raytune-kernels[plot]'") \
            from exc
    records = [r for r in load_records(path).records
               if weights is None or r.task_key in weights]
    if not records:
        raise ValueError("no records to plot" + (" of the model's tasks" if weights else ""))
    points = curves(records, weights)
    lines = task_lines(records, points)
    total = [p for p in points if math.isfinite(p.estimated_s)]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for col, (label, x) in enumerate((("trials", "task_trial"), ("wall time (s)", "elapsed_s"))):
        ax = axes[0][col]
        for key, pts in lines.items():
            ax.step([getattr(p, x) for p in pts], [p.task_best_s * 1e3 for p in pts],
                    where="post", lw=1, label=key)
        ax.set(xlabel=f"{label} of the task" if col == 0 else label,
               ylabel="best latency per task (ms)", yscale="log")
        if col == 0 and len(lines) <= 12:
            ax.legend(fontsize="x-small")
        ax = axes[1][col]
        ax.step([p.trial if col == 0 else p.elapsed_s for p in total],
                [p.estimated_s * 1e3 for p in total], where="post")
        ax.set(xlabel=label, ylabel="estimated latency (ms), tasks timed so far" if weights
               else "sum of best task latencies (ms)")
    fig.suptitle(f"{redact(path)}: {len(lines)} tasks, {len(records)} trials")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
