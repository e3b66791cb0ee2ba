"""Dataframes of records and tuning results (tune/frames.py)."""
import json
import math
import sys

import pytest

from raytune_kernels.measure import ERROR_KINDS
from raytune_kernels.task import Compute, Task, TensorSpec
from raytune_kernels.tune.frames import RECORD_COLUMNS, ROUND_COLUMNS, TASK_COLUMNS
from raytune_kernels.tune.records import Record, RecordWriter, load_records
from raytune_kernels.tune.result import TuningResult
from tests.support.fake import fake_tuner

pd = pytest.importorskip("pandas")
ERRORS = [f"errors_{k}" for k in ERROR_KINDS]


def rec(key, ms=None, ts=0.0, error=None, cfg=None):
    return Record(key, "llvm", "znver5", cfg or {"tile": ts}, () if error else (ms / 1e3,),
                  error_kind=error, error_msg="boom" if error else "", timestamp=ts,
                  threads=2, isa="avx2,fma")


def dense(m: int) -> Task:
    c = Compute("dense", (TensorSpec((m, 64)), TensorSpec((32, 64))), TensorSpec((m, 32)))
    return Task(c.key(), c, m // 4, (f"fc{m}", f"head.fc{m}"))


@pytest.fixture
def records_file(tmp_path):
    """Two tasks, five trials, written in the order measured but one: the last line was
    measured first (a file joined from two)."""
    path = str(tmp_path / "r.jsonl")
    with RecordWriter(path) as w:
        w.write_batch([rec("b", error="crashed", ts=101.0), rec("a", 1.0, ts=102.0),
                       rec("b", 2.0, ts=103.0), rec("a", 2.0, ts=104.0, cfg={"x": [1, 2]}),
                       rec("a", 3.0, ts=100.0)])
    return path


def test_records_frame_has_a_row_per_record_with_the_curves(records_file):
    df = load_records(records_file).to_dataframe()
    assert tuple(df.columns) == RECORD_COLUMNS and len(df) == 5
    assert list(df.task_key) == ["b", "a", "b", "a", "a"]  # the file's order
    assert list(df.trial) == [2, 3, 4, 5, 1]  # the order measured
    assert list(df.task_trial) == [1, 2, 2, 3, 1]
    assert df.median_ms.tolist()[1:] == pytest.approx([1.0, 2.0, 2.0, 3.0])
    assert math.isnan(df.median_ms[0]) and df.error_kind[0] == "crashed"
    assert df.error_msg[0] == "boom" and df.error_kind[1:].isna().all()
    assert df.task_best_ms.tolist()[1:] == pytest.approx([1.0, 2.0, 1.0, 3.0])
    assert math.isnan(df.task_best_ms[0])  # b has no valid time yet
    # every task counts once: after trial 2 (b failed) the sum is a's 3 ms alone
    assert df.estimated_ms.tolist() == pytest.approx([3.0, 1.0, 3.0, 3.0, 3.0])
    assert df.elapsed_s.tolist() == [1.0, 2.0, 3.0, 4.0, 0.0]
    assert json.loads(df.config[3]) == {"x": [1, 2]}
    assert set(df.threads) == {2} and set(df.isa) == {"avx2,fma"}
    assert df.timestamp[4] == 100.0 and set(df.device) == {"znver5"}


def test_records_frame_weighs_the_estimate_and_may_be_empty(records_file, tmp_path):
    df = load_records(records_file).to_dataframe(weights={"a": 2, "b": 1})
    assert df.sort_values("trial").estimated_ms.tolist() == pytest.approx([6, 6, 2, 4, 4])
    empty = load_records(str(tmp_path / "none.jsonl")).to_dataframe()
    assert tuple(empty.columns) == RECORD_COLUMNS and len(empty) == 0


def test_result_frame_has_a_row_per_task_with_its_errors():
    tasks = [dense(8), dense(16)]
    tuner = fake_tuner(tasks, 16, fail_every=3)
    result = tuner.run()
    df = result.to_dataframe()
    assert tuple(df.columns) == TASK_COLUMNS + tuple(ERRORS) and len(df) == 2
    assert list(df.key) == [t.key for t in tasks] and df.trials.sum() == 16
    assert list(df.layers) == [t.layers for t in tasks] and list(df.weight) == [2, 4]
    for t, row in zip(tasks, df.itertuples()):
        mine = [r for r in tuner.records if r.task_key == t.key]
        assert row.trials == len(mine)
        assert row.errors_crashed == sum(r.error_kind == "crashed" for r in mine)
        assert row.errors_timeout == sum(r.error_kind == "timeout" for r in mine)
        assert row.best_ms == pytest.approx(result.best[t.key].median * 1e3)
        assert row.gflops == pytest.approx(t.flops / result.best[t.key].median / 1e9)
    assert df[ERRORS].to_numpy().sum() == sum(not r.ok for r in tuner.records) == 5


def test_curve_frame_has_a_row_per_round():
    tuner = fake_tuner([dense(8), dense(16)], 16, fail_every=3)
    result = tuner.run()
    df = result.curve_dataframe()
    assert tuple(df.columns) == ROUND_COLUMNS + tuple(ERRORS)
    assert list(df["round"]) == [1, 2, 3, 4] and list(df.trials) == [4, 8, 12, 16]
    assert (df.valid + df[ERRORS].sum(axis=1)).tolist() == [4, 4, 4, 4]
    assert df.estimated_ms.iloc[-1] == pytest.approx(result.estimated_latency_s * 1e3)
    assert df.task_key.iloc[0] == tuner.tasks[0].key


def test_a_task_without_a_valid_time_is_nan_and_unknown_error_kinds_get_a_column():
    t = dense(8)
    result = TuningResult({}, math.inf, None, 3, [t], task_trials={t.key: 3},
                          task_errors={t.key: {"crashed": 2, "exotic": 1}})
    row = result.to_dataframe().iloc[0]
    assert math.isnan(row.best_ms) and math.isnan(row.gflops)
    assert row.errors_crashed == 2 and row.errors_exotic == 1 and row.errors_timeout == 0
    assert list(result.curve_dataframe().columns) == list(ROUND_COLUMNS) + ERRORS


def test_without_pandas_the_error_says_what_to_install(records_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        load_records(records_file).to_dataframe()
    with pytest.raises(ImportError, match=r"raytune-kernels\[data\]"):
        TuningResult({}, math.inf, None, 0).to_dataframe()
