"""The search's candidate pool and the cost model's batch prediction and retraining
schedule: what keeps the head's work per trial small (tune/search.py, tune/cost_model.py)."""
import collections
import dataclasses
import random

import numpy as np
import pytest

import raytune_kernels as rk
from raytune_kernels.backend import cpu_backend
from raytune_kernels.cpu.machine import CpuInfo, assumed_model
from raytune_kernels.tune.cost_model import (REFIT_GROWTH, CostModel, TrainingSet, refit_due,
                                             training_set)
from raytune_kernels.tune.records import record_of
from raytune_kernels.tune.search import EvolutionarySearch, SearchOptions
from raytune_kernels.tune.tuner import LocalSearchPool
from tests.support.fake import FakeMeasurer

CPU = CpuInfo("test", (16, 8), 32, assumed_model("test", (16, 8)))
BACKEND = cpu_backend(CPU)


@pytest.fixture(scope="module")
def conv(zoo_models):
    model, inputs = zoo_models["resnet18"]
    return next(t for t in rk.extract_tasks(model, inputs) if t.compute.op == "conv2d")


class CountingBackend:
    """BACKEND's analyze, counting every config it lowers."""

    def __init__(self):
        self.analysed = collections.Counter()
        self.backend = dataclasses.replace(BACKEND, analyze=self.analyze)

    def analyze(self, compute, cfgs, features=True):
        self.analysed.update(cfgs)
        return BACKEND.analyze(compute, cfgs, features)


def _round(search, model, records, task, fake, n=8):
    cfgs = search.propose(n, model)
    results = [fake.measure(task, c) for c in cfgs]
    search.observe(cfgs, [r.median for r in results])
    records += [record_of(task.key, "llvm", "test", c.to_json(), r)
                for c, r in zip(cfgs, results)]
    model.fit(training_set({task.key: task}, records, BACKEND.featurize))
    return cfgs


def test_a_config_is_analysed_once_across_proposals(conv):
    counting, fake, model, records = CountingBackend(), FakeMeasurer(), CostModel(), []
    search = EvolutionarySearch(conv, BACKEND.space(conv.compute), counting.backend, seed=2)
    for _ in range(6):
        _round(search, model, records, conv, fake)
    assert model.trained and max(counting.analysed.values()) == 1
    opts = SearchOptions()
    # the first proposal analyses `initial` samples, each later one `fresh` plus children
    # (the first with a trained model more generations of them)
    assert len(counting.analysed) <= opts.initial + opts.fresh + \
        opts.first_generations * opts.first_children + 4 * (
            opts.fresh + opts.generations * opts.children)


def test_the_pool_features_are_the_backends_per_config_features(conv):
    fake, model, records = FakeMeasurer(), CostModel(), []
    search = EvolutionarySearch(conv, BACKEND.space(conv.compute), BACKEND, seed=4)
    for _ in range(3):
        _round(search, model, records, conv, fake)
    assert search.features  # the proposal's picks, taken from the pool's rows
    for cfg, row in search.features.items():
        np.testing.assert_array_equal(row, np.float32(BACKEND.featurize(conv.compute, cfg)))
    pool = search.pool
    x, cost = BACKEND.analyze(conv.compute, pool.configs[:20])
    np.testing.assert_array_equal(pool.x[:20], x)
    np.testing.assert_array_equal(pool.estimates[:20], -cost)


def test_proposals_in_flight_are_never_proposed_again(conv):
    fake, model, records = FakeMeasurer(), CostModel(), []
    search = EvolutionarySearch(conv, BACKEND.space(conv.compute), BACKEND, seed=5)
    for _ in range(2):
        _round(search, model, records, conv, fake)
    waiting = search.propose(8, model) + search.propose(8, model)  # neither observed
    assert len(set(waiting)) == 16 and not set(waiting) & set(search.measured)
    assert not set(waiting) & set(search.pool.index)
    search.observe(waiting, [1.0] * 16)
    assert not search.pending


def test_the_pool_keeps_its_best_candidates_only(conv):
    opts = SearchOptions(keep=50)
    fake, model, records = FakeMeasurer(), CostModel(), []
    search = EvolutionarySearch(conv, BACKEND.space(conv.compute), BACKEND, 6, opts)
    for _ in range(3):
        _round(search, model, records, conv, fake)
    assert len(search.pool) == 50 and len(search.pool.index) == 50
    assert len(search.pool.x) == len(search.pool.estimates) == 50


def test_batch_prediction_equals_xgboosts_dmatrix_prediction(conv):
    xgb = pytest.importorskip("xgboost")
    fake, model, records = FakeMeasurer(), CostModel(), []
    search = EvolutionarySearch(conv, BACKEND.space(conv.compute), BACKEND, seed=7)
    for _ in range(3):
        _round(search, model, records, conv, fake)
    x = search.pool.x[:100]
    np.testing.assert_allclose(model.predict(x), model._booster.predict(xgb.DMatrix(x)),
                               rtol=1e-6)
    before = model.identity
    model.load(model.save())
    assert model.identity != before  # a new booster: the pool scores again


def test_retraining_follows_the_records_growth():
    assert refit_due(8, 0) and refit_due(1, 0) and not refit_due(0, 0)
    assert refit_due(50, 40) and not refit_due(49, 40)
    assert not refit_due(1000 + int(1000 * REFIT_GROWTH) - 1, 1000)
    trained, fits = 0, 0
    for n in range(8, 2001, 8):  # rounds of 8 records
        if refit_due(n, trained):
            trained, fits = n, fits + 1
    assert fits < 30  # every round would be 250


def test_the_pool_learns_when_due_and_reuses_the_searchs_features(conv):
    pool = LocalSearchPool([conv], BACKEND, 0, SearchOptions())
    fake, fitted = FakeMeasurer(), []
    fit = pool.model.fit
    pool.model.fit = lambda data: fitted.append(len(data)) or fit(data)
    for _ in range(10):
        cfgs = pool.propose(conv.key, 8)
        results = [fake.measure(conv, c) for c in cfgs]
        pool.observe(conv.key, cfgs, [r.median for r in results])
        pool.learn([record_of(conv.key, "llvm", "test", c.to_json(), r)
                    for c, r in zip(cfgs, results)])
    assert fitted == [8, 16, 24, 32, 40, 56, 72]  # then at 90 and later
    guided = pool.searches[conv.key].features
    assert guided and all((conv.key, _key(c)) in pool.features for c in guided)


def _key(cfg):
    from raytune_kernels.tune.records import config_key
    return config_key(cfg.to_json())


def test_a_model_too_small_to_train_is_retried_next_round():
    model = CostModel()
    data = TrainingSet([[0.0]] * 4, [1.0] * 4, [4])
    assert not model.refit(4, lambda: data) and model.trained_on == 0
    rng = random.Random(0)
    data = TrainingSet([[rng.random()] for _ in range(12)], [rng.random() for _ in range(12)],
                       [12])
    assert model.refit(12, lambda: data) and model.trained_on == 12 and model.trained
    assert not model.refit(13, lambda: pytest.fail("not due: no training set is made"))


def test_a_prepared_search_analyses_its_initial_pool_before_any_proposal(conv):
    counting, fake, model, records = CountingBackend(), FakeMeasurer(), CostModel(), []
    search = EvolutionarySearch(conv, BACKEND.space(conv.compute), counting.backend, seed=8)
    search.prepare(model)
    opts = SearchOptions()
    assert len(counting.analysed) == opts.initial == len(search.pool)
    _round(search, model, records, conv, fake)  # ranks the prepared pool, adds fresh ones
    assert len(counting.analysed) == opts.initial + opts.fresh
    assert max(counting.analysed.values()) == 1


def test_the_model_knows_how_many_records_of_each_task_it_learnt(conv):
    fake, model, records = FakeMeasurer(), CostModel(), []
    search = EvolutionarySearch(conv, BACKEND.space(conv.compute), BACKEND, seed=9)
    for _ in range(2):
        _round(search, model, records, conv, fake)
    assert model.learnt == {conv.key: 16}  # what the search weighs the model by
    copy = CostModel()
    copy.load_state(model.state())  # as a search actor loads the cost model actor's
    assert copy.learnt == model.learnt and copy.trained and copy.identity != model.identity
    x = search.pool.x[:10]
    np.testing.assert_array_equal(copy.predict(x), model.predict(x))


def test_the_backends_seeds_are_measured_first_and_once(conv):
    space = BACKEND.space(conv.compute)
    rng = random.Random(11)
    a, b = space.sample(rng), space.sample(rng)
    backend = dataclasses.replace(BACKEND, seeds=lambda compute: [a, b, a])
    fake, model, records = FakeMeasurer(), CostModel(), []
    search = EvolutionarySearch(conv, space, backend, seed=3)
    first = _round(search, model, records, conv, fake)
    assert first[:2] == [a, b] and len(set(first)) == 8
    later = [c for _ in range(3) for c in _round(search, model, records, conv, fake)]
    assert a not in later and b not in later
    # proposals of one: a seed each, in order; a resumed search skips what it measured
    one = EvolutionarySearch(conv, space, backend)
    assert one.propose(1, model) == [a] and one.propose(1, model) == [b]
    assert one.propose(1, model)[0] not in (a, b)
    resumed = EvolutionarySearch(conv, space, backend, seed=3)
    resumed.observe([a], [1e-3])
    assert resumed.propose(4, model)[0] == b


def test_a_cuda_task_measures_its_untuned_default_first(conv):
    """A task tuned for a trial runs at least what it would untuned on that GPU, tensor
    cores included."""
    from raytune_kernels.backend import backend_for
    from raytune_kernels.cuda.gpu import gpu_info
    from raytune_kernels.cuda.render import default_config

    for precision in ("fp32", "tf32", "fp16"):
        cuda = backend_for(f"cuda -arch=sm_90 -precision={precision}")
        search = EvolutionarySearch(conv, cuda.space(conv.compute), cuda, seed=1)
        first = search.propose(4, CostModel())
        assert first[0] == default_config(conv.compute, precision, gpu_info("sm_90").sms)
        assert (dict(first[0].knobs).get("kernel") == "mma") == (precision != "fp32")
    assert BACKEND.seeds(conv.compute) == []  # the CPU's estimate guides its first picks


def _four_families(zoo_models, opts: SearchOptions):
    """A search of ResNet-18's 14x14 3x3 conv whose pool holds 8 candidates of each of
    four kernel families, ranked family by family: (search, the families, each family's
    sampled configs, the ranking)."""
    model, inputs = zoo_models["resnet18"]
    task = next(t for t in rk.extract_tasks(model, inputs)
                if t.compute.describe() == "conv2d 1x256x14x14 -> 256ch k3x3 s1 +bias+relu")
    space = BACKEND.space(task.compute)
    search = EvolutionarySearch(task, space, BACKEND, seed=0, opts=opts)
    rng, by_family = random.Random(5), {}
    for _ in range(20000):
        c = space.sample(rng)
        by_family.setdefault(search._family(c), []).append(c)
    families = sorted((f for f, cs in by_family.items() if len(cs) >= 12), key=repr)[:4]
    assert len(families) == 4 and len({f[0] for f in by_family}) >= 4  # direct, im2col, F2, F4
    assert len({f[1] for f in by_family}) == 2  # 8 and 16 lanes
    cfgs = [c for f in families for c in by_family[f][4:12]]
    search.pool.add(cfgs, np.zeros((len(cfgs), 1), np.float32), np.zeros(len(cfgs)),
                    CostModel(), [search._family(c) for c in cfgs])
    return search, families, by_family, np.arange(len(cfgs))


def test_each_kernel_family_in_contention_gets_picks_and_parents(zoo_models):
    """A space's kernel families (algorithm and vector width) do not compete for a batch by
    rank alone: the measured ones within 1.3x of the best share it round-robin, each its
    own best-ranked candidates, and have their own parents; before two are measured, the
    ranking alone picks."""
    search, families, by_family, order = _four_families(
        zoo_models, SearchOptions(share_after=8, probe=0))
    lead, second, third, behind = families
    # ranked: every `lead` candidate first, then `second`'s...

    def picked(n):
        return [search._family(search.pool.configs[i]) for i in search._picks(order, n)]

    assert picked(7) == [lead] * 7  # none measured: the ranking alone
    search.observe(by_family[lead][:4], [1.0] * 4)
    search.observe(by_family[third][:1], [1.5])  # behind
    search.observe(by_family[second][:2], [1.2, 1.25])  # within 1.3x, but 7 measured of 8
    assert search._contending() == [] and picked(7) == [lead] * 7
    search.observe(by_family[second][2:4], [2.0, 3.0])
    search.observe(by_family[behind][:4], [1.5, 1.6, 1.7, 1.8])
    assert search._contending() == [lead, second]
    assert picked(1) == [lead]
    assert picked(7) == [lead, second] * 3 + [lead]
    assert all(search._picks(order, 7) < 16)  # each its best ranked
    parents = search._part_parents(order, sorted(search.measured, key=search.measured.get))
    assert [search._family(c) for c in parents].count(second) == \
        2 * SearchOptions().part_parents
    one = EvolutionarySearch(search.task, search.space, BACKEND, seed=0,
                             opts=SearchOptions(part_picks=False))
    one.pool = search.pool
    assert [search._family(one.pool.configs[i]) for i in one._picks(order, 7)] == [lead] * 7


def test_a_family_the_task_has_no_measurement_of_is_probed_once(zoo_models):
    """Once a task has share_after measurements (a resumed task's records, say), each
    family of the pool none of them is from gets its best-ranked candidate in the next
    batch, at most half of it; measured or pending, it is not probed again."""
    search, families, by_family, order = _four_families(zoo_models, SearchOptions(share_after=8))
    lead, second, third, behind = families

    def picked(n):
        return [search._family(search.pool.configs[i]) for i in search._picks(order, n)]

    search.observe(by_family[lead][:4], [1.0] * 4)
    search.observe(by_family[second][:3], [2.0, 2.1, 2.2])
    assert picked(7) == [lead] * 7  # 7 measured of 8: no probe yet
    search.observe(by_family[second][3:4], [2.3])
    picks = search._picks(order, 7)
    assert list(picks[:2]) == [16, 24]  # the best ranked of `third`, then of `behind`
    assert picked(7) == [third, behind] + [lead] * 5
    assert picked(3) == [third] + [lead] * 2  # probes take at most half a batch
    search.pending.add(search.pool.configs[16])  # proposed, not observed yet
    assert picked(7) == [behind] + [lead] * 6
    search.pending.clear()
    search.observe(by_family[third][:1] + by_family[behind][:1], [9.0, float("inf")])
    assert picked(7) == [lead] * 7  # measured, if only an error: probed no more
    none = EvolutionarySearch(search.task, search.space, BACKEND, seed=0,
                              opts=SearchOptions(share_after=8, probe=0))
    none.pool = search.pool
    none.observe(by_family[lead][:4] + by_family[second][:4], [1.0] * 4 + [2.0] * 4)
    assert [search._family(none.pool.configs[i]) for i in none._picks(order, 7)] == [lead] * 7
