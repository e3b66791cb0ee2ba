"""Tuning curves (tune/curves.py) and their plot (tune/plot.py)."""
import math

import pytest

from raytune_kernels.tune.curves import curves
from raytune_kernels.tune.plot import plot_records, task_lines
from raytune_kernels.tune.records import Record, RecordWriter

PNG = b"\x89PNG\r\n\x1a\n"


def rec(key, ms=None, ts=0.0):
    return Record(key, "llvm", "cpu", {"ts": ts}, (ms / 1e3,) if ms else (),
                  error_kind=None if ms else "crashed", timestamp=ts)


RECORDS = [rec("a", 4.0, 1.0), rec("b", None, 2.0), rec("a", 5.0, 3.0), rec("b", 3.0, 4.0),
           rec("a", 1.0, 5.0), rec("c", 2.0, 0.5)]


def test_curves_follow_each_task_and_the_weighted_estimate():
    points = curves(RECORDS, weights={"a": 2, "b": 1})  # c is not a task of the model
    assert [p.index for p in points] == [5, 0, 1, 2, 3, 4]  # by timestamp
    assert [p.task_trial for p in points] == [1, 1, 1, 2, 2, 3]
    assert [p.task_best_s * 1e3 for p in points] == pytest.approx([2, 4, math.inf, 4, 3, 1])
    assert [p.estimated_s * 1e3 for p in points] == pytest.approx([0, 8, 8, 8, 11, 5])
    assert [p.elapsed_s for p in points] == [0.0, 0.5, 1.5, 2.5, 3.5, 4.5]
    lines = task_lines(RECORDS, points)
    assert {k: [p.task_trial for p in ps] for k, ps in lines.items()} == \
        {"c": [1], "a": [1, 2, 3], "b": [2]}  # b's line starts at its first valid time
    assert math.isinf(curves([rec("a", None, 1.0)])[0].estimated_s)


def test_plot_draws_the_model_tasks_only(tmp_path):
    src, png = str(tmp_path / "r.jsonl"), str(tmp_path / "curve.png")
    with RecordWriter(src) as w:
        w.write_batch(RECORDS)
    assert plot_records(src, png, weights={"a": 2, "b": 1}) == png
    with open(png, "rb") as f:
        assert f.read(8) == PNG
    with pytest.raises(ValueError, match="no records to plot of the model's tasks"):
        plot_records(src, png, weights={"z": 1})
