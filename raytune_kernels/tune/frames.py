"""pandas views of tuning data: a result's tasks and rounds, a records file's records.

pandas is optional (the `data` extra) and imported only when a frame is asked for. A time
that does not exist (a task with no valid record, a failed candidate) is NaN, pandas' own
missing value, so that means and minima skip it. Error counts are one integer column per
error kind, `errors_<kind>`, every kind of measure.ERROR_KINDS always present."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from raytune_kernels.measure import ERROR_KINDS
from raytune_kernels.tune.curves import curves

TASK_COLUMNS = ("key", "compute", "layers", "weight", "trials", "best_ms", "gflops")
ROUND_COLUMNS = ("round", "task_key", "trials", "elapsed_s", "estimated_ms", "valid")
RECORD_COLUMNS = ("trial", "task_key", "task_trial", "target", "device", "isa", "threads",
                  "cold_weights", "config", "median_ms", "task_best_ms", "estimated_ms",
                  "error_kind", "error_msg", "build_s", "run_s", "timestamp", "elapsed_s")


def pandas():
    try:
        import pandas
    except ImportError as exc:
        raise ImportError("dataframes need pandas: pip install pandas "
                          "(or pip install 'raytune-kernels[data]')") from exc
    return pandas


def _ms(seconds: float) -> float:
    return seconds * 1e3 if math.isfinite(seconds) else math.nan


def _kinds(counts: Sequence[Mapping[str, int]]) -> tuple[str, ...]:
    """ERROR_KINDS, then any other kind the counts name (records of another version)."""
    other = {k for c in counts for k in c} - set(ERROR_KINDS)
    return ERROR_KINDS + tuple(sorted(other))


def _frame(rows: list[dict], columns: Sequence[str], counts: list[Mapping[str, int]]):
    kinds = _kinds(counts)
    for row, c in zip(rows, counts):
        row.update({f"errors_{k}": c.get(k, 0) for k in kinds})
    return pandas().DataFrame(rows, columns=[*columns, *(f"errors_{k}" for k in kinds)])


def task_frame(result) -> "pandas.DataFrame":
    """One row per tuned task of a TuningResult; gflops is that of the best record."""
    rows = []
    for t in result.tasks:
        best = result.best.get(t.key)
        rows.append({"key": t.key, "compute": t.compute.describe(), "layers": t.layers,
                     "weight": t.weight, "trials": result.task_trials.get(t.key, 0),
                     "best_ms": _ms(best.median) if best else math.nan,
                     "gflops": t.flops / best.median / 1e9 if best else math.nan})
    return _frame(rows, TASK_COLUMNS, [result.task_errors.get(t.key, {}) for t in result.tasks])


def round_frame(points) -> "pandas.DataFrame":
    """One row per RoundPoint: the estimate after each round."""
    rows = [{"round": p.round, "task_key": p.task_key, "trials": p.trials,
             "elapsed_s": p.elapsed_s, "estimated_ms": _ms(p.estimated_s), "valid": p.valid}
            for p in points]
    return _frame(rows, ROUND_COLUMNS, [p.errors for p in points])


def records_frame(records: Sequence, weights: Mapping[str, int] | None = None
                  ) -> "pandas.DataFrame":
    """One row per record, in the order given. `trial`, `task_trial`, `task_best_ms`,
    `estimated_ms` and `elapsed_s` are the curves of tune/curves.py (what the plot
    draws); `config` is the config as sorted JSON text (json.loads gives the dict)."""
    rows = [{}] * len(records)
    for p in curves(records, weights):
        r = records[p.index]
        rows[p.index] = {
            "trial": p.trial, "task_key": r.task_key, "task_trial": p.task_trial,
            "target": r.target, "device": r.device, "isa": r.isa, "threads": r.threads,
            "cold_weights": r.cold_weights, "config": r.config_key(),
            "median_ms": _ms(r.median), "task_best_ms": _ms(p.task_best_s),
            "estimated_ms": _ms(p.estimated_s), "error_kind": r.error_kind,
            "error_msg": r.error_msg, "build_s": r.build_s, "run_s": r.run_s,
            "timestamp": r.timestamp, "elapsed_s": p.elapsed_s}
    return pandas().DataFrame(rows, columns=list(RECORD_COLUMNS))
