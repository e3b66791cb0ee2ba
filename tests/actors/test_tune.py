"""tune_network end to end on a tiny model, through the real actors."""
import collections
import dataclasses
import time
import warnings

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.tune.records import RecordWriter, load_records
from tests.support.nets import Depthwise, Tiny, before_knob


@pytest.mark.e2e
def test_tune_network_then_resume(ray_session, tmp_path):
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    path = str(tmp_path / "tiny.jsonl")
    result = rk.tune_network(model, (x,), trials=12, records=path, batch=4, verbose=False)
    tasks = rk.extract_tasks(model, (x,))
    assert set(result.best) == {t.key for t in tasks} and result.trials == 12
    assert result.records == path
    records = load_records(path).records
    assert len(records) == 12 and all(r.ok for r in records)
    expected = sum(t.weight * result.best[t.key].median for t in tasks)
    assert result.estimated_latency_s == pytest.approx(expected) and result.torch_s == 0.0

    again = rk.tune_network(model, (x,), trials=16, records=path, batch=4, verbose=False)
    records = load_records(path).records
    assert len(records) == 16 and again.trials == 16
    assert max(collections.Counter((r.task_key, r.config_key()) for r in records).values()) == 1
    assert again.estimated_latency_s <= result.estimated_latency_s


class WithIsland(Tiny):
    def forward(self, x):  # cumprod has no node of ours: it runs PyTorch between our kernels
        return self.fc(torch.cumprod(torch.relu(self.conv(x)), dim=3).flatten(1))


def test_estimate_includes_the_islands_pytorch_time(ray_session, tmp_path):
    model, x = WithIsland().eval(), torch.randn(1, 16, 8, 8)
    with pytest.warns(UserWarning, match="cumprod"):
        result = rk.tune_network(model, (x,), trials=8, batch=4, verbose=False)
    tasks = rk.extract_tasks(model, (x,))
    kernels = sum(t.weight * result.best[t.key].median for t in tasks)
    # the island's time was measured: positive, and small next to a 1-second bound
    assert 0 < result.torch_s < 1.0
    assert result.estimated_latency_s == pytest.approx(kernels + result.torch_s)


def test_tune_tasks_tunes_only_the_tasks_given(ray_session, tmp_path):
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    conv = next(t for t in rk.extract_tasks(model, (x,)) if t.compute.op == "conv2d")
    path = str(tmp_path / "conv.jsonl")
    result = rk.tune_tasks([conv], trials=4, records=path, batch=4, verbose=False)
    assert set(result.best) == {conv.key} and result.trials == 4
    assert {r.task_key for r in load_records(path).records} == {conv.key}
    assert result.estimated_latency_s == pytest.approx(conv.weight * result.best[conv.key].median)


def test_fewer_trials_than_tasks_warms_and_measures_as_many_tasks(ray_session, tmp_path):
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    tasks = rk.extract_tasks(model, (x,))
    assert len(tasks) >= 2
    path = str(tmp_path / "few.jsonl")
    with pytest.warns(UserWarning, match=f"1 trials for {len(tasks)} tasks: "
                                         f"{len(tasks) - 1} task"):
        result = rk.tune_tasks(tasks, trials=1, records=path, batch=4, verbose=False)
    assert result.trials == 1 and len(load_records(path).records) == 1
    assert result.estimated_latency_s == float("inf")


@pytest.mark.e2e
def test_records_of_another_cpu_are_kept_but_not_resumed(ray_session, tmp_path):
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    conv = next(t for t in rk.extract_tasks(model, (x,)) if t.compute.op == "conv2d")
    path = str(tmp_path / "mixed.jsonl")
    rk.tune_tasks([conv], trials=2, records=path, batch=2, verbose=False)
    mine = load_records(path).records
    foreign = [dataclasses.replace(r, device="znver0", isa="sse4.2") for r in mine]
    with RecordWriter(path) as w:
        w.write_batch(foreign)
    with pytest.warns(UserWarning, match=r"skipped 2 record\(s\) of target 'llvm' measured on "
                                         r"another device \(2 of znver0\)"):
        result = rk.tune_tasks([conv], trials=4, records=path, batch=2, verbose=False)
    after = load_records(path).records
    assert after[:4] == mine + foreign and len(after) == 6  # nothing lost, 2 new here
    assert result.trials == 4 and {r.device for r in after[4:]} == {mine[0].device}


@pytest.mark.e2e
def test_resuming_records_from_before_a_knob_names_the_task_that_never_searched_it(
        ray_session, tmp_path):
    """Depthwise records written before windows had the out_layout knob (read as the
    blocked kernels they were): resuming them warns that only this run's new trials can
    reach NHWC, and those trials are made; records of today's space warn of nothing."""
    model, x = Depthwise().eval(), torch.randn(1, 16, 8, 8)
    (dw,) = rk.extract_tasks(model, (x,))
    path = str(tmp_path / "dw.jsonl")
    rk.tune_tasks([dw], trials=2, records=path, batch=2, verbose=False)
    today = load_records(path).records
    old = [before_knob(r) for r in today]
    older = str(tmp_path / "older.jsonl")
    with RecordWriter(older) as w:
        w.write_batch(old)
    with pytest.warns(UserWarning, match=r"1 task\(s\) hold only records written before the "
                                         r"knob\(s\) out_layout.*only the trials this run "
                                         r"adds beyond the 2 records resumed search it"):
        result = rk.tune_tasks([dw], trials=4, records=older, batch=2, verbose=False)
    assert result.trials == 4 and all("out_layout" in r.config
                                      for r in load_records(older).records[2:])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        rk.tune_tasks([dw], trials=3, records=path, batch=1, verbose=False)


def test_a_budget_the_records_already_hold_starts_no_actor(ray_session, tmp_path,
                                                           monkeypatch):
    """Resumed records that already hold the trials asked: the best of them, the same
    estimate, the callbacks told of the start and the end, nothing measured, and no
    scheduler actor (nor its measurers, builders and search actors) started."""
    import actors.tuning_actors

    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    path = str(tmp_path / "done.jsonl")
    first = rk.tune_network(model, (x,), trials=6, records=path, batch=3, verbose=False)

    class NotStarted:
        @staticmethod
        def options(**_):
            raise AssertionError("a scheduler actor was started")
    monkeypatch.setattr(actors.tuning_actors, "TaskSchedulerActor", NotStarted)
    heard = []

    class Told(rk.Callback):
        def on_start(self, summary):
            heard.append(("start", summary.trials))

        def on_round(self, summary):
            heard.append(("round", summary.trials))

        def on_end(self, result):
            heard.append(("end", result.trials))
    again = rk.tune_network(model, (x,), trials=6, records=path, batch=3, verbose=False,
                            callbacks=[Told()])
    assert again.best == first.best and again.trials == 6 and again.rounds == []
    assert again.records == path
    assert again.estimated_latency_s == first.estimated_latency_s
    assert again.setup["measurers"] == 0 and heard == [("start", 6), ("end", 6)]
    assert len(load_records(path).records) == 6
    with pytest.raises(AssertionError, match="a scheduler actor was started"):
        rk.tune_network(model, (x,), trials=7, records=path, batch=3, verbose=False)


def test_a_cuda_run_whose_gpu_never_answers_tunes_as_usual(ray_session, monkeypatch):
    """Where no GPU of the cluster takes the task that names it (none here; elsewhere all
    busy), the shortcut gives way after its timeout and the run goes on to its actors."""
    import actors.driver as driver
    from raytune_kernels.tune.request import TuneRequest
    from raytune_kernels.tune.records import record_of
    from raytune_kernels.measure import MeasureResult

    conv = next(t for t in rk.extract_tasks(Tiny().eval(), (torch.randn(1, 16, 8, 8),),
                                            target="cuda") if t.compute.op == "conv2d")
    history = [record_of(conv.key, "cuda -arch=sm_90 -precision=tf32", "NVIDIA H100",
                         {"i": i}, MeasureResult(times=(1e-5,))) for i in range(3)]
    request = TuneRequest(target="cuda -precision=tf32", tasks=(conv,), trials=2)
    monkeypatch.setattr(driver, "GPU_IDENTITY_TIMEOUT_S", 0.5)
    assert driver._recorded_already(ray_session, request, history) is None
    # too few records on any target: no GPU is asked at all
    monkeypatch.setattr(driver, "_gpu_identity", None)
    assert driver._recorded_already(ray_session, dataclasses.replace(request, trials=4),
                                    history) is None


def test_a_relative_records_path_is_resolved_once_by_the_driver(ray_session, tmp_path,
                                                                monkeypatch):
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    conv = next(t for t in rk.extract_tasks(model, (x,)) if t.compute.op == "conv2d")
    monkeypatch.chdir(tmp_path)
    result = rk.tune_tasks([conv], trials=2, records="rel.jsonl", batch=2, verbose=False)
    assert result.records == str(tmp_path / "rel.jsonl")
    assert len(load_records(str(tmp_path / "rel.jsonl")).records) == 2
    from actors.driver import TuneError
    with pytest.raises(TuneError, match="records must be a path or a URI, got int"):
        rk.tune_tasks([conv], trials=2, records=3, verbose=False)


def test_bad_inputs_fail_before_any_work(tmp_path):
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    with pytest.raises(rk.UnknownTargetError):
        rk.tune_network(model, (x,), target="rocm")
    with pytest.raises(OSError, match="cannot write records"):
        rk.tune_network(model, (x,), records=str(tmp_path / "missing" / "r.jsonl"))
    from actors.driver import TuneError
    with pytest.raises(TuneError, match="cannot reach a Ray cluster"):
        rk.tune_network(model, (x,), address="127.0.0.1:1")
    tasks = rk.extract_tasks(model, (x,))  # tune_tasks runs the same checks first
    with pytest.raises(rk.UnknownTargetError):
        rk.tune_tasks(tasks, target="rocm")
    with pytest.raises(OSError, match="cannot write records"):
        rk.tune_tasks(tasks, records=str(tmp_path / "missing" / "r.jsonl"))
    with pytest.raises(TuneError, match="cannot reach a Ray cluster"):
        rk.tune_tasks(tasks, address="127.0.0.1:1")
    with pytest.raises(TuneError, match="-mcpu=notacpu is not a CPU LLVM knows"):
        rk.tune_network(model, (x,), target="llvm -mcpu=notacpu")
    for bad in ({"trials": 0}, {"batch": -1}, {"threads": 0}, {"num_builders": -1},
                {"num_measurers": 0}, {"trials": 2.5}):
        (name, value), = bad.items()
        with pytest.raises(TuneError, match=f"{name} must be a positive integer, got {value}"):
            rk.tune_network(model, (x,), **bad)
        with pytest.raises(TuneError, match=f"{name} must be a positive integer"):
            rk.tune_tasks(tasks, **bad)
    for seconds in (0, -1.0, float("inf"), "60", True):
        with pytest.raises(TuneError, match="seconds must be a positive number or None, "
                                            f"got {seconds!r}"):
            rk.tune_network(model, (x,), seconds=seconds)


class Heard(rk.Callback):
    """What a run told it; raises in on_records of round `stop` (None: never)."""

    def __init__(self, stop=None):
        self.stop, self.rounds, self.records, self.result = stop, [], [], None

    def on_records(self, records):
        self.records += records
        if len(self.rounds) + 1 == self.stop:
            raise RuntimeError("stop")

    def on_round(self, summary):
        self.rounds.append(summary)

    def on_end(self, result):
        self.result = result


@pytest.mark.e2e
def test_callbacks_hear_the_rounds_and_a_raising_one_keeps_the_records(ray_session, tmp_path,
                                                                      capsys):
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    conv = next(t for t in rk.extract_tasks(model, (x,)) if t.compute.op == "conv2d")
    path = str(tmp_path / "cb.jsonl")
    heard = Heard()
    result = rk.tune_tasks([conv], trials=4, records=path, batch=2, callbacks=[heard])
    assert [s.trials for s in heard.rounds] == [2, 4] and heard.result is result
    assert heard.records == load_records(path).records and len(heard.records) == 4
    assert [p.trials for p in result.rounds] == [2, 4]
    assert result.to_dataframe().trials.tolist() == [4]
    out = " ".join(capsys.readouterr().out.split())  # verbose: the progress view's table
    assert "Trials: 4/4" in out and f"4 trials; records: {path}" in out
    with pytest.raises(rk.CallbackError, match="callback Heard.on_records raised RuntimeError: "
                                               r"stop \(tuning stopped after round 1, 6 trial"):
        rk.tune_tasks([conv], trials=8, records=path, batch=2, verbose=False,
                      callbacks=[Heard(stop=1)])
    assert len(load_records(path).records) == 6
    from actors.driver import TuneError
    with pytest.raises(TuneError, match="callbacks must be a list of raytune_kernels.Callback"):
        rk.tune_tasks([conv], callbacks=print)


class Slow(rk.Callback):
    """Takes a second over each round it hears of, and notes when it let each go."""

    def __init__(self):
        self.started, self.done = None, []

    def on_start(self, summary):
        self.started = time.monotonic()

    def on_round(self, summary):
        time.sleep(1.0)
        self.done.append(time.monotonic() - self.started)


@pytest.mark.e2e
def test_a_time_budget_ends_the_run_with_every_round_recorded(ray_session, tmp_path):
    """With `seconds`, no round starts once that long has passed since the first began:
    every round but the last was let go within the budget, the last past it, and the run
    ends well short of its trials with a result of those rounds and exactly their records
    in the file."""
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    path = str(tmp_path / "timed.jsonl")
    slow = Slow()
    result = rk.tune_network(model, (x,), trials=200, records=path, batch=2, verbose=False,
                             callbacks=[slow], seconds=3.0)
    assert slow.done[-1] >= 3.0 and all(t < 3.0 + 0.5 for t in slow.done[:-1])
    assert len(result.rounds) == len(slow.done) and result.trials < 200
    assert len(load_records(path).records) == result.trials == result.rounds[-1].trials
    assert result.best


def test_a_host_fault_in_the_scheduler_actor_reaches_the_caller_by_name(ray_session):
    """A batch that failed only for the machine's sake stops the run: the caller gets a
    TuneError with the cause, not Ray's wrapped traceback."""
    import ray

    from actors.driver import TuneError, host_fault_error
    from actors.pipeline import HostFault

    @ray.remote(num_cpus=0)
    class Stops:
        def step(self):
            raise HostFault("No space left on device (temp directory /tmp); free it and "
                            "resume")

    actor = Stops.remote()
    with pytest.raises(ray.exceptions.RayTaskError) as caught:
        ray.get(actor.step.remote())
    ray.kill(actor)
    error = host_fault_error(caught.value)
    assert isinstance(error, TuneError)
    assert str(error) == ("tuning stopped: No space left on device (temp directory /tmp); "
                          "free it and resume")
    assert host_fault_error(RuntimeError("something else")) is None
