"""Callbacks of a tuning run (tune/callbacks.py), on the Tuner with the fake measurer."""
import io

import pytest
from rich.console import Console

import raytune_kernels as rk
from raytune_kernels.task import Compute, Task, TensorSpec
from raytune_kernels.tune.progress import ProgressView
from raytune_kernels.tune.records import RecordWriter, load_records
from tests.support.fake import fake_tuner


def dense(m: int) -> Task:
    c = Compute("dense", (TensorSpec((m, 64)), TensorSpec((32, 64))), TensorSpec((m, 32)))
    return Task(c.key(), c, 1)


class Log(rk.Callback):
    """Everything it hears, in order; checks each round's records are on disk first."""

    def __init__(self, path=None):
        self.path, self.events, self.records = path, [], []

    def on_start(self, summary):
        self.events.append(("start", summary.round, summary.trials))

    def on_records(self, records):
        self.records += records
        if self.path:
            assert load_records(self.path).records == self.records
        self.events.append(("records", len(records)))

    def on_round(self, summary):
        self.events.append(("round", summary.round, summary.trials))

    def on_end(self, result):
        self.events.append(("end", result))


class StopAt(rk.Callback):
    def __init__(self, round_):
        self.round = round_

    def on_round(self, summary):
        if summary.round == self.round:
            raise ValueError("enough")


def test_callbacks_hear_every_round_its_records_and_the_end(tmp_path):
    path = str(tmp_path / "r.jsonl")
    log, quiet = Log(path), rk.Callback()  # the base class does nothing
    with RecordWriter(path) as w:
        tuner = fake_tuner([dense(8), dense(16)], 12, writer=w)
        result = tuner.run([log, quiet])
    assert log.events == [("start", 0, 0), ("records", 4), ("round", 1, 4), ("records", 4),
                          ("round", 2, 8), ("records", 4), ("round", 3, 12), ("end", result)]
    assert log.records == tuner.records == load_records(path).records


def test_a_raising_callback_stops_the_run_and_keeps_its_records(tmp_path):
    path = str(tmp_path / "r.jsonl")
    log = Log()
    with RecordWriter(path) as w:
        with pytest.raises(rk.CallbackError, match=r"callback StopAt.on_round raised "
                                                   r"ValueError: enough \(tuning stopped after "
                                                   r"round 2, 8 trial\(s\); their records are "
                                                   rf"in {path}\)") as info:
            fake_tuner([dense(8), dense(16)], 16, writer=w).run([StopAt(2), log])
    assert isinstance(info.value.__cause__, ValueError)
    assert len(load_records(path).records) == 8
    assert log.events[-1] == ("records", 4)  # round 2 told to the callbacks before StopAt


def test_the_progress_view_is_a_callback():
    out = io.StringIO()
    view = ProgressView(8, Console(file=out, width=80), table_every=1)
    fake_tuner([dense(8)], 8).run([view])
    text = " ".join(out.getvalue().split())
    assert "round 0" in text and "round 2" in text and "Trials: 8/8" in text
    assert "over 1 tasks, 8 trials; records: None" in text and "estimated latency" in text
    view.__exit__(None, None, None)  # closing again (the driver does on an error)
    assert " ".join(out.getvalue().split()) == text
