"""Tuning curves from a records file: best latency per task and the estimated network
latency, against trials and against wall time (matplotlib, the `plot` extra)."""
from __future__ import annotations

import math
from collections import defaultdict

from raytune_kernels.tune.records import Record, load_records


def curves(records: list[Record]) -> dict:
    """Per task: (trial index, seconds since start, best so far); and the network estimate
    (sum over tasks seen so far of task-count-weighted best) after each trial."""
    if not records:
        raise ValueError("no records to plot")
    start = min(r.timestamp for r in records)
    best: dict[str, float] = {}
    per_task: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    total: list[tuple[int, float, float]] = []
    for i, r in enumerate(sorted(records, key=lambda r: r.timestamp), 1):
        if r.ok and r.median < best.get(r.task_key, math.inf):
            best[r.task_key] = r.median
            per_task[r.task_key].append((i, r.timestamp - start, r.median))
        total.append((i, r.timestamp - start, sum(best.values())))
    return {"tasks": dict(per_task), "total": total}


def plot_records(path: str, out: str, weights: dict[str, int] | None = None) -> str:
    """Draw the curves of `path` into the PNG `out`; returns `out`."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'raytune-kernels[plot]'") \
            from exc
    data = curves(load_records(path).records)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for col, (label, idx) in enumerate((("trials", 0), ("wall time (s)", 1))):
        ax = axes[0][col]
        for key, pts in data["tasks"].items():
            ax.step([p[idx] for p in pts], [p[2] * 1e3 for p in pts], where="post", lw=1)
        ax.set(xlabel=label, ylabel="best latency per task (ms)", yscale="log")
        ax = axes[1][col]
        ax.plot([p[idx] for p in data["total"]], [p[2] * 1e3 for p in data["total"]])
        ax.set(xlabel=label, ylabel="sum of best task latencies (ms)")
    fig.suptitle(f"{path}: {len(data['tasks'])} tasks, {len(data['total'])} trials")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
