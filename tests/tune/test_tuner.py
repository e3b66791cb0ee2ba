"""Search, scheduler and tuner against the fake measurer (analytic timings)."""
import collections
import dataclasses
import math
import random

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu.machine import CpuInfo, assumed_model
from raytune_kernels.cpu.schedules import space_for
from raytune_kernels.tune.cost_model import CostModel
from tests.support.fake import FakeMeasurer
from tests.support.nets import Depthwise, before_knob
from raytune_kernels.tune.records import RecordWriter, load_records
from raytune_kernels.tune.task_scheduler import TaskScheduler
from raytune_kernels.tune.search import EvolutionarySearch, SearchOptions
from raytune_kernels.task import Compute, Task, TensorSpec
from raytune_kernels.tune.tuner import LocalSearchPool, TuneOptions, Tuner
from raytune_kernels.backend import cpu_backend
from raytune_kernels.space import Config

CPU = CpuInfo("test", (16, 8), 32, assumed_model("test", (16, 8)))
BACKEND = cpu_backend(CPU)


@pytest.fixture(scope="module")
def tasks(zoo_models):
    model, inputs = zoo_models["resnet18"]
    return rk.extract_tasks(model, inputs)


def fake_measure(fake):
    return lambda items: [fake.measure(t, c) for t, c in items]


def tune(tasks, trials, path=None, history=(), seed=0, batch=8):
    """Tune against the fake. Its timings follow no machine, so the search runs on the
    cost model alone, without the analytic estimate of cycles (tests/cpu/test_estimate.py)."""
    fake = FakeMeasurer()
    writer = RecordWriter(path) if path else None
    opts = SearchOptions(estimate_trials=0)
    tuner = Tuner(tasks, "llvm", "test", fake_measure(fake),
                  LocalSearchPool(tasks, BACKEND, seed, opts), writer, list(history),
                  TuneOptions(trials=trials, batch=batch, seed=seed, search=opts))
    result = tuner.run()
    if writer:
        writer.close()
    return tuner, result, fake


def test_search_never_repeats_a_config(tasks):
    task = tasks[3]
    search = EvolutionarySearch(task, space_for(task.compute, CPU), BACKEND, seed=1)
    fake, model, seen = FakeMeasurer(), CostModel(), set()
    from raytune_kernels.tune.cost_model import training_set
    from raytune_kernels.tune.records import record_of
    records = []
    for _ in range(12):
        cfgs = search.propose(8, model)
        assert len(cfgs) == 8 and not (set(cfgs) & seen) and len(set(cfgs)) == 8
        seen |= set(cfgs)
        results = [fake.measure(task, c) for c in cfgs]
        search.observe(cfgs, [r.median for r in results])
        records += [record_of(task.key, "llvm", "t", c.to_json(), r) for c, r in zip(cfgs, results)]
        model.fit(training_set({task.key: task}, records, BACKEND.featurize))
    assert model.trained


def test_search_stops_when_the_space_is_exhausted():
    c = Compute("softmax", (TensorSpec((4, 16)),), TensorSpec((4, 16)), (("dim", 1),))
    task = Task(c.key(), c, 1)
    space = space_for(c, CPU)
    search = EvolutionarySearch(task, space, BACKEND)
    got = search.propose(100, CostModel())
    assert len(got) == space.count() < 100
    search.observe(got, [1.0] * len(got))
    assert search.exhausted and search.propose(4, CostModel()) == []


@pytest.mark.e2e  # many seeded searches: a statistical check
def test_model_guided_search_beats_random_on_the_fake(tasks):
    """Same budget: the guided search's best is faster than random sampling's, as a
    geometric mean over seeds (single seeds can lose; the model is seeded, so this is
    deterministic). Single seeds range from 0.6 to 0.98, hence 12 of them: over 6, a knob
    added to the space moved the mean across the line with the search unchanged."""
    task = tasks[12]
    space = space_for(task.compute, CPU)
    fake = FakeMeasurer()
    ratios = []
    for seed in range(12):
        _, r, _ = tune([task], 96, seed=seed)
        rng = random.Random(seed)
        random_best = min(fake.measure(task, space.sample(rng)).median for _ in range(96))
        ratios.append(r.best[task.key].median / random_best)
    assert math.prod(ratios) ** (1 / len(ratios)) < 0.85, ratios


def test_resumed_records_from_before_a_knob_evolve_and_are_not_measured_again():
    """Depthwise records written before windows had out_layout: resumed with a trained
    model, the search evolves from them (mutation and crossover read every knob) and
    proposes none of the kernels they already measured."""
    (dw,) = rk.extract_tasks(Depthwise(32).eval(), (torch.randn(1, 32, 14, 14),))
    tuner, _, _ = tune([dw], 24)
    old = [before_knob(r) for r in tuner.records]
    assert all("out_layout" in r.config for r in tuner.records)
    resumed, result, _ = tune([dw], 48, history=old)
    assert result.trials == 48

    def kernel(r):  # a record without out_layout measured the blocked kernel
        return (r.config_key() if "out_layout" in r.config else
                dataclasses.replace(r, config={**r.config, "out_layout": "blocked"}).config_key())
    new = [kernel(r) for r in resumed.records[len(old):]]
    assert len(new) == 24 and len(set(new)) == 24
    assert not set(new) & {kernel(r) for r in old}


def test_scheduler_favours_heavy_tasks_with_room(tasks):
    light = tasks[20]  # the 1 MFLOP dense layer
    heavy = tasks[2]   # a 3x3 conv, weight 2
    tuner, result, _ = tune([light, heavy], 160)
    trials = {s.task.key: s.trials for s in tuner.scheduler.states}
    assert trials[heavy.key] > 2 * trials[light.key]
    assert result.trials == 160 and math.isfinite(result.estimated_latency_s)


def test_scheduler_warms_up_every_task_first(tasks):
    sched = TaskScheduler(tasks[:5])
    order = []
    for _ in range(5):
        i = sched.next_task()
        order.append(i)
        sched.update(i, [1.0])
    assert order == [0, 1, 2, 3, 4]


def test_a_budget_under_tasks_times_batch_still_measures_every_task(tasks):
    some = tasks[:6]
    tuner, result, fake = tune(some, 20, batch=8)
    per_task = collections.Counter(r.task_key for r in tuner.records)
    assert tuner.spent == 20 and set(per_task) == {t.key for t in some}
    assert min(per_task.values()) >= 3 and math.isfinite(result.estimated_latency_s)
    tuner, _, _ = tune(some, 4, batch=8)  # fewer trials than tasks: one each, in order
    assert [r.task_key for r in tuner.records] == [t.key for t in some[:4]]


def test_resume_continues_exactly(tasks, tmp_path):
    some = [tasks[2], tasks[5], tasks[20]]
    path = str(tmp_path / "r.jsonl")
    tune(some, 40, path)
    first = load_records(path).records
    assert len(first) == 40
    tuner, result, fake = tune(some, 72, path, history=first)
    records = load_records(path).records
    assert len(records) == 72 and fake.calls == 32 and tuner.spent == 72
    per_task = collections.Counter((r.task_key, r.config_key()) for r in records)
    assert max(per_task.values()) == 1  # nothing measured twice across the two runs
    first_best = {k: min(r.median for r in first if r.task_key == k) for k in result.best}
    assert all(result.best[k].median <= first_best[k] for k in result.best)
    _, again, fake = tune(some, 72, path, history=records)
    assert fake.calls == 0 and again.trials == 72


def test_a_resumed_task_whose_seed_was_never_measured_gets_its_first_round(tasks, tmp_path):
    """Records of other configs stand for tasks that never ran their seed (what they run
    untuned): each still gets a warm-up round, which measures its seed first, before the
    gain rule hands out rounds (it would favour the heaviest task with every one)."""
    some = [tasks[2], tasks[5], tasks[20]]
    rng = random.Random(5)
    seeds = {t.key: BACKEND.space(t.compute).sample(rng) for t in some}
    backend = dataclasses.replace(BACKEND, seeds=lambda compute: [seeds[compute.key()]])
    path = str(tmp_path / "s.jsonl")
    tune(some, 24, path)  # no seeds then
    first = load_records(path).records
    assert not {(r.task_key, Config.from_json(r.config)) for r in first} & set(seeds.items())
    fake, made, opts = FakeMeasurer(), [], SearchOptions(estimate_trials=0)

    def measure(items):
        made.extend((t.key, c) for t, c in items)
        return [fake.measure(t, c) for t, c in items]
    pool = LocalSearchPool(some, backend, 0, opts)
    assert all(pool.unseeded(t.key, [Config.from_json(r.config) for r in first
                                     if r.task_key == t.key]) for t in some)
    Tuner(some, "llvm", "test", measure, pool, None, first,
          TuneOptions(trials=24 + 3, batch=1, search=opts)).run()
    assert sorted(made) == sorted(seeds.items())
    assert not pool.unseeded(some[0].key, [seeds[some[0].key]])


def test_the_scheduler_owes_a_resumed_task_not_warmed_its_first_round(tasks):
    sched = TaskScheduler(tasks[:3], seed=0)
    sched.resume(0, [1e-3], warmed=True)
    sched.resume(1, [2e-3], warmed=False)
    sched.resume(2, [3e-3])
    assert sched.next_task() == 1 and sched.states[1].trials == 1
    sched.update(1, [1.5e-3])
    assert all(s.rounds == 1 for s in sched.states)


def test_records_of_another_device_are_counted_and_not_resumed(tasks, tmp_path):
    some = [tasks[2], tasks[5]]
    path = str(tmp_path / "r.jsonl")
    tune(some, 16, path)
    here = load_records(path).records
    elsewhere = [dataclasses.replace(r, device="znver3") for r in here]
    fake = FakeMeasurer()
    tuner = Tuner(some, "llvm", "test", fake_measure(fake), LocalSearchPool(some, BACKEND),
                  None, elsewhere + here[:8], TuneOptions(trials=24, batch=8))
    assert tuner.other_devices == {"znver3": 16} and tuner.spent == 8
    tuner.run()
    assert fake.calls == 16 and {r.device for r in tuner.records} == {"test"}


def test_records_at_another_thread_count_are_not_resumed(tasks, tmp_path):
    """A time at 1 thread says nothing about the same kernel at 2: a run at 2 threads
    measures afresh and writes its records with threads=2."""
    some = [tasks[2]]
    path = str(tmp_path / "r.jsonl")
    tune(some, 16, path)
    fake = FakeMeasurer()
    tuner = Tuner(some, "llvm", "test", fake_measure(fake), LocalSearchPool(some, BACKEND), None,
                  load_records(path).records, TuneOptions(trials=16, threads=2))
    tuner.run()
    assert fake.calls == 16 and {r.threads for r in tuner.records} == {2}


def test_a_resumed_run_starts_with_a_trained_model(tasks, tmp_path):
    some = [tasks[2], tasks[5]]
    path = str(tmp_path / "r.jsonl")
    tune(some, 32, path)
    pool = LocalSearchPool(some, BACKEND)
    Tuner(some, "llvm", "test", fake_measure(FakeMeasurer()), pool, None,
          load_records(path).records, TuneOptions(trials=64))
    assert pool.model.trained


def test_progress_table_fits_a_log_and_states_the_estimate(tasks):
    import io

    from rich.console import Console

    from raytune_kernels.tune.progress import ProgressView
    from raytune_kernels.tune.tuner import RoundSummary
    tuner, _, _ = tune(tasks[:3], 24)
    out = io.StringIO()
    view = ProgressView(24, Console(file=out, width=80), table_every=1)
    with view:
        view.update(RoundSummary(3, 0, tuner.rows(), tuner.scheduler.objective(), 24, 24, 1.0,
                                 8, {}))
    text = out.getvalue()
    assert "Estimated total latency:" in text and "Trials: 24/24" in text
    assert "of it PyTorch" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    out = io.StringIO()
    with ProgressView(24, Console(file=out, width=80), table_every=1) as view:
        view.update(RoundSummary(3, 0, tuner.rows(), 0.0125, 24, 24, 1.0, 8, {}, 0.0025))
    assert "12.500 ms (2.500 ms of it PyTorch)" in " ".join(out.getvalue().split())


class _Watched:
    """The fake's measure and a LocalSearchPool, noting which task is being measured when
    each proposal is made (a measurement takes a few ms, as a real one does)."""

    def __init__(self, tasks, fail_after: int | None = None):
        self.fake, self.measuring, self.proposals = FakeMeasurer(), None, []
        self.pool = LocalSearchPool(tasks, BACKEND, 0, SearchOptions(estimate_trials=0))
        self.fail_after = fail_after

    def measure(self, items):
        import time

        self.measuring = items[0][0].key
        time.sleep(0.02)
        out = [self.fake.measure(t, c) for t, c in items]
        self.measuring = None
        return out

    def propose(self, key, n):
        self.proposals.append((key, self.measuring))
        if self.fail_after is not None and len(self.proposals) > self.fail_after:
            raise RuntimeError("search actor died")
        return self.pool.propose(key, n)

    def __getattr__(self, name):  # observe, learn, exhausted: the pool's
        return getattr(self.pool, name)


def test_overlapped_rounds_propose_while_measuring_and_spend_the_budget_exactly(tasks):
    some = tasks[:6]
    w = _Watched(some)
    opts = TuneOptions(trials=70, batch=8, search=SearchOptions(estimate_trials=0),
                       overlap=True)
    tuner = Tuner(some, "llvm", "test", w.measure, w, opts=opts)
    result = tuner.run()
    assert tuner.spent == 70 and result.trials == 70
    seen = collections.Counter((r.task_key, r.config_key()) for r in tuner.records)
    assert max(seen.values()) == 1  # nothing proposed twice, in flight or measured
    assert set(result.best) == {t.key for t in some}
    ahead = [(k, busy) for k, busy in w.proposals if busy is not None]
    assert len(ahead) >= len(w.proposals) - 2  # all but the first ran beside a measurement
    assert all(k != busy for k, busy in ahead)  # never the task being measured


def test_an_overlapped_round_is_recorded_when_the_next_proposal_fails(tasks, tmp_path):
    some = tasks[:3]
    w = _Watched(some, fail_after=2)
    path = str(tmp_path / "r.jsonl")
    writer = RecordWriter(path)
    opts = TuneOptions(trials=40, batch=4, search=SearchOptions(estimate_trials=0),
                       overlap=True)
    tuner = Tuner(some, "llvm", "test", w.measure, w, writer, opts=opts)
    assert tuner.step() is not None  # round 1 measured beside round 2's proposal
    with pytest.raises(RuntimeError, match="search actor died"):
        tuner.step()  # round 2 measured, round 3's proposal fails
    writer.close()
    assert len(load_records(path).records) == 8 == tuner.spent


def test_scheduler_passes_over_a_busy_task(tasks):
    sched = TaskScheduler(tasks[:2])
    assert sched.next_task(busy=0) == 1
    sched.update(1, [1.0], exhausted=True)
    assert sched.next_task(busy=0) is None and sched.next_task() == 0


class _Cluster:
    """Tuner.stream's launch and wait on the fake: rounds finish out of order, a few at a
    time, as on many measurers."""

    def __init__(self, seed=0):
        self.fake, self.rng = FakeMeasurer(), random.Random(seed)
        self.flight, self.launched, self.most = {}, [], 0

    def launch(self, items):
        handle = len(self.launched)
        self.launched.append(items)
        self.flight[handle] = [self.fake.measure(t, c) for t, c in items]
        self.most = max(self.most, len(self.flight))
        return handle

    def wait(self, handles):
        done = self.rng.sample(handles, self.rng.randint(1, min(3, len(handles))))
        return [(h, self.flight.pop(h)) for h in done]


def test_streamed_rounds_keep_depth_in_flight_and_record_every_trial_once(tasks, tmp_path):
    some, path = tasks[:5], str(tmp_path / "s.jsonl")
    cluster, writer = _Cluster(), RecordWriter(path)
    opts = SearchOptions(estimate_trials=0)
    tuner = Tuner(some, "llvm", "test", None, LocalSearchPool(some, BACKEND, 0, opts), writer,
                  opts=TuneOptions(trials=100, batch=4, search=opts))
    result = tuner.stream(cluster.launch, cluster.wait, depth=8)
    writer.close()
    assert result.trials == 100 == tuner.spent
    assert cluster.most == 8  # more rounds than tasks: some task had two in flight
    launched = collections.Counter((t.key, c) for items in cluster.launched for t, c in items)
    assert max(launched.values()) == 1 and sum(launched.values()) == 100
    written = collections.Counter((r.task_key, r.config_key())
                                  for r in load_records(path).records)
    assert max(written.values()) == 1 and sum(written.values()) == 100
    assert set(result.best) == {t.key for t in some}


def test_a_stream_gives_a_task_a_second_round_only_when_every_task_has_one(tasks):
    some, cluster = tasks[:3], _Cluster()
    opts = SearchOptions(estimate_trials=0)
    tuner = Tuner(some, "llvm", "test", None, LocalSearchPool(some, BACKEND, 0, opts),
                  opts=TuneOptions(trials=24, batch=4, search=opts))
    first = []
    launch = cluster.launch
    cluster.launch = lambda items: first.append(items[0][0].key) or launch(items)
    tuner.stream(cluster.launch, cluster.wait, depth=4)
    assert sorted(first[:3]) == sorted(t.key for t in some)  # one each, then a second


def test_a_stream_asks_a_pool_for_the_free_places_rounds_in_one_call(tasks):
    some, cluster = tasks[:6], _Cluster(seed=3)
    opts = SearchOptions(estimate_trials=0)
    local, calls = LocalSearchPool(some, BACKEND, 0, opts), []

    class Many:  # search actors: one call proposes several rounds in parallel
        def propose_many(self, asks):
            calls.append(asks)
            return [local.propose(key, n) for key, n in asks]

        def __getattr__(self, name):
            return getattr(local, name)

    tuner = Tuner(some, "llvm", "test", None, Many(),
                  opts=TuneOptions(trials=96, batch=4, search=opts))
    result = tuner.stream(cluster.launch, cluster.wait, depth=6)
    assert result.trials == 96
    assert [len(keys) for keys in calls[:1]] == [6]  # the first fills every place at once
    assert max(len(a) for a in calls[1:]) > 1  # rounds done together are replaced together
    assert len({k for k, _ in calls[0]}) == 6  # six tasks, one round each
