"""compile/refine.py: each step's kernel chosen as the network runs it."""
import dataclasses
import json
import random
import time
from types import SimpleNamespace

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cache import CACHE_ENV
from raytune_kernels.compile import refine as rf
from raytune_kernels.compile.api import compile_network
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.measure import measure_built
from raytune_kernels.cpu.schedules import prefetch_twin, space_for
from raytune_kernels.errors import CompileError
from raytune_kernels.frontend.partition import GlueStep, TaskStep, partition
from raytune_kernels.layout.costs import layouts_of
from raytune_kernels.layout.graph import Candidate
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.space import Config
from raytune_kernels.tune.records import record_of


# ------------------------------------------------------------ the choice, on fake networks

class FakeNet:
    """A network of kernel steps (one per task step, a transform before the second) whose
    clocked steps take the seconds `took(variant, step, round)` gives."""

    def __init__(self, part, j, took):
        keys = [s.key for s in part.steps if isinstance(s, TaskStep)]
        self.steps = [SimpleNamespace(key=keys[0], kind="kernel", name="a"),
                      SimpleNamespace(key=None, kind="transform", name="t"),
                      *[SimpleNamespace(key=k, kind="kernel", name=k) for k in keys[1:]]]
        self.j, self.took, self.round = j, took, 0

    def __call__(self, *xs):
        return None

    def _clock_steps(self, xs, runs):
        kernels = iter(range(len(self.steps)))
        out = [0.001 if s.key is None else self.took(self.j, next(kernels), self.round)
               for s in self.steps]
        self.round += 1
        return out


def fake_plan(n_alts: int):
    steps = (TaskStep("k0", "conv0", (), (), "v0"), GlueStep("g"),
             TaskStep("k1", "conv1", (), (), "v1"))
    part = SimpleNamespace(steps=steps)
    chosen = [Candidate("NHWC", "NHWC", 1.0, f"c{i}") for i in range(len(steps))]
    alts = {i: [chosen[i]] + [Candidate("NHWC", "NHWC", 1.0 + j, f"c{i}.{j}")
                              for j in range(1, n_alts)]
            for i in (0, 2)}
    return part, chosen, alts


def run_fake(took, n_alts=3, monkeypatch=None, end_to_end=1.2, prebuild=None, key=None,
             assemble=None):
    """refine() over fake networks; the picked network's end-to-end check says
    `end_to_end` (the plan's time over the picked one's)."""
    part, chosen, alts = fake_plan(n_alts)
    checked = []

    def confirm(plan, picked, xs, budget_s):
        checked.append((plan.j, picked.j))
        return end_to_end
    monkeypatch.setattr(rf, "_confirm", confirm)
    # kernel step index 0 is task step 0, kernel step index 1 is task step 2
    assemble = assemble or (lambda p: FakeNet(part, plans.index(p) if p in plans else -1,
                                              took))
    out, report, net = rf.refine(part, chosen, alts, assemble, [torch.zeros(1)], n_alts,
                                 prebuild=prebuild, budget_s=0.0, key=key)
    # the network handed back runs the plan returned: the picked one, or the plan's own
    assert net is None or net.j == (-1 if report.changed else 0)
    return out, report, alts, checked


plans: list = []


@pytest.fixture(autouse=True)
def _track_plans(monkeypatch):
    """Each variant's plan, so a FakeNet knows which variant it is."""
    plans.clear()
    real = rf.variant

    def variant(chosen, alts, j):
        plans.append(real(chosen, alts, j))
        return plans[-1]
    monkeypatch.setattr(rf, "variant", variant)


def faster_step0(j, k, r):
    """Step 0: variant 2 is 20% faster in every round; step 2: no alternative is faster."""
    return (10e-6 * (0.8 if j == 2 else 1.0)) if k == 0 else 5e-6 * (1 + j)


def test_an_alternative_faster_in_every_round_replaces_the_plans_kernel(monkeypatch):
    out, report, alts, checked = run_fake(faster_step0, monkeypatch=monkeypatch)
    assert out[0] is alts[0][2] and out[2] is alts[2][0]
    assert report.variants == 3 and report.steps == 2 and report.changed == ["conv0"]
    assert report.after_s == pytest.approx(report.before_s - 2e-6)
    assert checked == [(0, -1)] and report.speedup == 1.2  # the plan's network, the picked
    assert "1 of 2 steps changed (end to end 1.200x" in report.describe()


def test_an_alternative_that_does_not_build_is_not_weighed(monkeypatch):
    asked = []

    def prebuild(pairs):
        asked.extend(pairs)
        return {("k0", "c0.2"), ("k1", "c2.1"), ("k1", "c2.2")}  # step 2: nothing left
    out, report, alts, checked = run_fake(faster_step0, monkeypatch=monkeypatch,
                                          prebuild=prebuild)
    assert set(asked) == {("k0", "c0"), ("k0", "c0.1"), ("k0", "c0.2"),
                          ("k1", "c2"), ("k1", "c2.1"), ("k1", "c2.2")}
    # step 0's faster kernel (rank 2) did not build: only ranks 0 and 1 are built and weighed
    assert report.variants == 2 and report.steps == 1
    assert out[0] is alts[0][0] and report.changed == [] and checked == []


def test_what_a_refinement_kept_is_recalled_by_the_next_compile(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    out, report, alts, checked = run_fake(faster_step0, monkeypatch=monkeypatch, key="plan")
    assert out[0] is alts[0][2] and not report.recalled and checked

    def never(p):
        raise AssertionError("a recalled refinement assembles no network")
    again, report, alts, checked = run_fake(faster_step0, monkeypatch=monkeypatch,
                                            key="plan", assemble=never)
    assert [c.config for c in again] == [c.config for c in out] and checked == []
    assert report.recalled and report.changed == ["conv0"] and report.speedup == 1.2
    assert "recalled" in report.describe()
    # another plan (key) is weighed afresh; a kept "none" is recalled as none
    out, report, alts, _ = run_fake(faster_step0, monkeypatch=monkeypatch, key="other",
                                    end_to_end=1.0)
    assert report.changed == [] and not report.recalled
    out, report, alts, _ = run_fake(faster_step0, monkeypatch=monkeypatch, key="other",
                                    assemble=never)
    assert report.recalled and report.changed == [] and out[0] is alts[0][0]


def test_a_damaged_or_stale_cache_line_is_ignored(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    (tmp_path / "refine.jsonl").write_text(
        "not json\n"
        + json.dumps({"key": "plan", "picks": [[0, 7]], "variants": 3, "speedup": 1.5}) + "\n"
        + json.dumps({"key": "plan", "picks": [[1, 1]], "variants": 3, "speedup": 1.5}) + "\n")
    _, _, alts = fake_plan(3)
    assert rf.recall("plan", alts) is None  # rank 7 and step 1 name no alternative
    out, report, alts, checked = run_fake(faster_step0, monkeypatch=monkeypatch, key="plan")
    assert not report.recalled and checked and out[0] is alts[0][2]
    assert rf.recall("plan", alts)["picks"] == [(0, 2)]


def test_the_key_names_the_threads_and_every_steps_alternatives_in_order():
    part, chosen, alts = fake_plan(3)
    alts = {i: [Candidate(c.in_layout, c.out_layout, c.seconds, Config((("x", j),)))
                for j, c in enumerate(a)] for i, a in alts.items()}
    chosen = [alts[0][0], Candidate("NCHW", "NCHW", 0.0), alts[2][0]]
    key = rf.decision_key(part, chosen, alts, 2)
    assert key == rf.decision_key(part, chosen, alts, 2)
    assert key != rf.decision_key(part, chosen, alts, 1)
    swapped = {**alts, 0: [alts[0][0], alts[0][2], alts[0][1]]}
    assert rf.decision_key(part, chosen, swapped, 2) != key
    # another plan around the same alternatives (a step without any runs another layout)
    other = [chosen[0], Candidate("NHWC", "NHWC", 0.0), chosen[2]]
    assert rf.decision_key(part, other, alts, 2) != key


def test_picks_that_do_not_run_faster_end_to_end_are_dropped(monkeypatch):
    out, report, alts, checked = run_fake(faster_step0, monkeypatch=monkeypatch,
                                          end_to_end=1.0)
    assert out[0] is alts[0][0] and out[2] is alts[2][0] and report.changed == []
    assert checked and "the picks kept none" in report.describe()


def test_a_lucky_round_or_a_gain_within_the_margin_keeps_the_plan(monkeypatch):
    # step 0: variant 1 faster by 30% in two rounds, slower in the third;
    # step 2: variant 1 faster in every round, by 2% (< MARGIN)
    def took(j, k, r):
        if k == 0:
            return 10e-6 * ({0: 0.7, 1: 1.5, 2: 0.7}[r] if j == 1 else 1.0)
        return 5e-6 * (0.98 if j == 1 else 1.0)
    out, report, alts, checked = run_fake(took, monkeypatch=monkeypatch)
    assert out[0] is alts[0][0] and out[2] is alts[2][0]
    assert report.changed == [] and report.after_s == report.before_s
    assert checked == [] and "no step ran faster on another record" in report.describe()


def test_the_end_to_end_check_times_both_networks_interleaved():
    def spinning(seconds):
        def call(*xs):
            t = time.perf_counter()
            while time.perf_counter() - t < seconds:
                pass
        return call
    ratio = rf._confirm(spinning(400e-6), spinning(200e-6), [], 0.05)
    assert 1.5 < ratio < 2.5


def test_one_variant_or_nothing_to_weigh_builds_nothing():
    part, chosen, alts = fake_plan(3)
    built = []
    out, report, net = rf.refine(part, chosen, alts, built.append, [], 1)
    assert out == chosen and built == [] and report.variants == 1 and net is None
    out, report, net = rf.refine(part, chosen, {}, built.append, [], 4)
    assert out == chosen and built == [] and net is None
    assert "no step had another record" in report.describe()


def test_variants_are_capped_by_the_memory_their_weights_take():
    alts = {0: [None] * 8, 3: [None] * 2}
    assert rf.variant_count(alts, 8, 1 << 20) == 8
    assert rf.variant_count(alts, 4, 1 << 20) == 4
    assert rf.variant_count(alts, 8, rf.MEMORY_BYTES // 3) == 3
    assert rf.variant_count(alts, 8, rf.MEMORY_BYTES * 2) == 1


def test_a_variant_runs_each_steps_jth_alternative_or_keeps_its_choice():
    chosen = ["a", "b", "c"]
    alts = {0: ["a", "a1", "a2"], 2: ["c", "c1"]}
    assert rf.variant(chosen, alts, 0) == chosen
    assert rf.variant(chosen, alts, 2) == ["a2", "b", "c"]
    assert rf.variant(chosen, alts, 1) == ["a1", "b", "c1"]


# ----------------------------------------------------- split agreement, on fake networks

class RowsNet:
    """A fake network of the plan `p` (fake_plan's steps): `rows` is the set of its task
    steps (0, 2) running their row-splitting kernel; its kernel steps clock as
    `took(rows, kernel index)` says."""

    def __init__(self, part, p, took):
        self.rows = frozenset(i for i in (0, 2) if str(p[i].config).endswith("rows"))
        self.steps = FakeNet(part, 0, None).steps
        self.took = took

    def __call__(self, *xs):
        return None

    def _clock_steps(self, xs, runs):
        kernels = iter(range(len(self.steps)))
        return [0.001 if s.key is None else self.took(self.rows, next(kernels))
                for s in self.steps]


def run_agree(monkeypatch, took, speedups, key=None, assemble=None, prebuild=None):
    """agree() over fake networks: `speedups` maps the set of steps splitting rows in a
    network to what the end-to-end check says of it against the plan."""
    part, chosen, _ = fake_plan(1)
    rows = {i: [chosen[i], Candidate("NHWC", "NHWC", 2.0, f"c{i}.rows")] for i in (0, 2)}
    confirmed = []

    def confirm(plan, net, xs, budget_s):
        assert plan.rows == frozenset()
        confirmed.append(net.rows)
        return speedups[net.rows]
    monkeypatch.setattr(rf, "_confirm", confirm)
    assemble = assemble or (lambda p: RowsNet(part, p, took))
    out, report, net = rf.agree(part, chosen, rows, assemble, [torch.zeros(1)], prebuild,
                                budget_s=0.0, key=key)
    return out, report, net, rows, chosen, confirmed


def rows_slow_at_step2(rows, k):
    """Step 2 runs 20% slower splitting rows (its own time); step 0 the same either way."""
    return 10e-6 * (1.2 if k == 1 and 2 in rows else 1.0)


def test_agreement_keeps_every_step_splitting_rows_where_that_runs_fastest(monkeypatch):
    out, report, net, rows, chosen, confirmed = run_agree(
        monkeypatch, rows_slow_at_step2, {frozenset({0, 2}): 1.10, frozenset({0}): 1.05})
    # step 2's own time rose in every round: the network without it was weighed too
    assert set(confirmed) == {frozenset({0, 2}), frozenset({0})}
    assert out[0] is rows[0][1] and out[2] is rows[2][1] and out[1] is chosen[1]
    assert net.rows == frozenset({0, 2})
    assert report.steps == 2 and report.kept == 2 and report.speedup == 1.10
    assert "2 now do (end to end 1.100x" in report.describe()


def test_agreement_sends_back_the_steps_that_ran_slower_where_that_wins(monkeypatch):
    out, report, net, rows, chosen, _ = run_agree(
        monkeypatch, rows_slow_at_step2, {frozenset({0, 2}): 1.02, frozenset({0}): 1.08})
    assert out[0] is rows[0][1] and out[2] is chosen[2] and net.rows == frozenset({0})
    assert report.kept == 1 and report.speedup == 1.08


def test_agreement_keeps_the_plan_unless_a_network_runs_faster_by_the_margin(monkeypatch):
    same = lambda rows, k: 10e-6  # noqa: E731 (no step slower: one network weighed)
    out, report, net, rows, chosen, confirmed = run_agree(
        monkeypatch, same, {frozenset({0, 2}): 1 + rf.MARGIN / 4})
    assert confirmed == [frozenset({0, 2})]
    assert out == chosen and net.rows == frozenset() and report.kept == 0
    assert "the plan's splits kept" in report.describe()


def test_agreement_is_recalled_and_skips_what_does_not_build(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    speedups = {frozenset({0, 2}): 1.10, frozenset({0}): 1.05}
    out, report, *_ = run_agree(monkeypatch, rows_slow_at_step2, speedups, key="p")
    assert report.kept == 2 and not report.recalled

    def never(p):
        raise AssertionError("a recalled agreement assembles no network")
    again, report, net, *_ = run_agree(monkeypatch, rows_slow_at_step2, speedups, key="p",
                                       assemble=never)
    assert report.recalled and report.kept == 2 and net is None
    assert [c.config for c in again] == [c.config for c in out]
    # step 2's row kernel does not build: step 0 alone is weighed
    out, report, net, rows, chosen, confirmed = run_agree(
        monkeypatch, rows_slow_at_step2, speedups, prebuild=lambda pairs: {("k1", "c2.rows")})
    assert confirmed == [frozenset({0})] and out[2] is chosen[2] and report.kept == 1


def test_agreement_with_nothing_to_split_or_no_memory_builds_nothing():
    part, chosen, _ = fake_plan(1)
    built = []
    out, report, net = rf.agree(part, chosen, {}, built.append, [])
    assert out == chosen and built == [] and net is None and report.steps == 0
    assert "every kernel already splits rows, or none can" in report.describe()
    rows = {0: [chosen[0], Candidate("NHWC", "NHWC", 2.0, "c0.rows")]}
    out, report, net = rf.agree(part, chosen, rows, built.append, [], networks=1)
    assert out == chosen and built == [] and net is None and report.kept == 0


def test_agreement_weighs_the_network_sending_steps_back_only_where_memory_allows(
        monkeypatch):
    part, chosen, _ = fake_plan(1)
    rows = {i: [chosen[i], Candidate("NHWC", "NHWC", 2.0, f"c{i}.rows")] for i in (0, 2)}
    confirmed = []

    def confirm(plan, net, xs, budget_s):
        confirmed.append(net.rows)
        return 1.10
    monkeypatch.setattr(rf, "_confirm", confirm)
    out, report, net = rf.agree(part, chosen, rows,
                                lambda p: RowsNet(part, p, rows_slow_at_step2),
                                [torch.zeros(1)], budget_s=0.0, networks=2)
    assert confirmed == [frozenset({0, 2})] and report.kept == 2


def test_a_kernels_split_axis_is_the_first_of_its_spatial_order():
    assert rf.split_axis(Config((("spatial_order", ("ko", "oh", "ow")),))) == "ko"
    assert rf.split_axis(Config((("spatial_order", ("pt", "ko")),))) == "pt"
    assert rf.split_axis(Config((("lanes", 16),))) is None
    assert rf.split_axis("torch") is None


def test_row_alternatives_are_the_fastest_row_split_record_of_the_plans_layouts():
    part, _, _ = fake_plan(1)
    part.task = lambda key: SimpleNamespace(key=key)

    def cfg(first, tag):
        return Config((("spatial_order", (first, "ow")), ("tag", tag)))
    layouts = lambda task, c: ("NHWC", "NCHW16c" if c["tag"] == "other" else "NHWC")  # noqa
    chosen = [Candidate("NHWC", "NHWC", 1.0, cfg("ko", "plan")), Candidate("NHWC", "NHWC", 0),
              Candidate("NHWC", "NHWC", 1.0, cfg("oh", "plan"))]

    def rec(key, first, tag, median, threads=2, ok=True):
        return SimpleNamespace(task_key=key, config=cfg(first, tag).to_json(), median=median,
                               threads=threads, ok=ok)
    records = [rec("k0", "oh", "slow", 3.0), rec("k0", "oh", "other", 1.0),
               rec("k0", "oh", "fast", 2.0), rec("k0", "oh", "bad", 0.5, ok=False),
               rec("k0", "oh", "one thread", 0.5, threads=1), rec("k0", "ow", "cols", 0.5),
               rec("k1", "ko", "x", 1.0)]
    alts = rf.row_alternatives(part, chosen, records, layouts, 2, lambda s, c: False)
    # step 2 already splits rows; step 0's fastest row record of its layouts, ok, 2 threads
    assert list(alts) == [0] and alts[0][0] is chosen[0]
    assert alts[0][1].config["tag"] == "fast"
    # one whose output would be bordered where the plan's is not is no alternative
    bordered = rf.row_alternatives(part, chosen, records, layouts, 2,
                                   lambda s, c: c.config["tag"] == "fast")
    assert bordered[0][1].config["tag"] == "slow" and bordered[0][1].seconds == 3.0


def test_without_a_row_record_the_plans_own_kernel_reordered_is_the_alternative():
    """row_alternatives with `twin`: a step no record offers a row split gets its own
    kernel reordered (at the plan's time, its layouts); a record still comes first; a step
    whose twin is None is left out."""
    part, _, _ = fake_plan(1)
    part.task = lambda key: SimpleNamespace(key=key)
    plan = Config((("spatial_order", ("ko", "oh")), ("tag", "plan")))
    chosen = [Candidate("NHWC", "NHWC", 1.0, plan), Candidate("NHWC", "NHWC", 0),
              Candidate("NCHW16c", "NCHW16c", 2.0, plan)]
    layouts = lambda task, c: ("NHWC", "NHWC")  # noqa: E731
    asked = []

    def twin(step, cfg):
        asked.append(step.key)
        return Config((("spatial_order", ("oh", "ko")), ("tag", "twin")))
    record = SimpleNamespace(task_key="k0", median=3.0, threads=2, ok=True, config=Config(
        (("spatial_order", ("oh", "ko")), ("tag", "record"))).to_json())
    alts = rf.row_alternatives(part, chosen, [record], layouts, 2, lambda s, c: False, twin)
    assert asked == ["k1"] and alts[0][1].config["tag"] == "record"
    assert alts[2][0] is chosen[2] and alts[2][1].config["tag"] == "twin"
    assert (alts[2][1].in_layout, alts[2][1].out_layout, alts[2][1].seconds) == \
        ("NCHW16c", "NCHW16c", 2.0)
    assert rf.row_alternatives(part, chosen, [], layouts, 2, lambda s, c: False,
                               lambda step, cfg: None) == {}


def test_the_two_agreements_report_as_one():
    by_record = rf.Agreed(steps=3, kept=2, speedup=1.05, seconds=2.0, recalled=True)
    reordered = rf.Agreed(steps=4, kept=1, speedup=1.02, seconds=3.0)
    both = by_record.joined(reordered)
    assert (both.steps, both.kept, both.reordered, both.reordered_kept) == (3, 2, 4, 1)
    assert both.speedup == pytest.approx(1.05 * 1.02) and both.seconds == 5.0
    assert not both.recalled  # an agreement with nothing to weigh recalls nothing
    assert by_record.joined(rf.Agreed(recalled=False)).recalled
    assert "3 steps could split rows first by a record, 4 by their own kernel reordered, " \
        "2 and 1 now do (end to end 1.071x" in both.describe()
    none_kept = rf.Agreed(steps=3).joined(rf.Agreed(steps=4))
    assert none_kept.speedup is None and "the plan's splits kept" in none_kept.describe()
    assert by_record.joined(rf.Agreed()).speedup == 1.05
    assert "every kernel already splits rows" in rf.Agreed().joined(rf.Agreed()).describe()


# ------------------------------------------------- the ILP's plan against one layout's

class PlanNet:
    """A network that says which plan it was assembled from."""

    def __init__(self, plan):
        self.plan = plan


def run_weigh(monkeypatch, speedup, key=None, assemble=None, prebuild=None, same=False):
    """weigh_plans() over fake networks; the end-to-end check says `speedup` (the ILP
    plan's time over the one-layout plan's)."""
    part, chosen, _ = fake_plan(1)
    other = list(chosen) if same else \
        [Candidate("NCHW16c", "NCHW16c", 2.0, "u0"), chosen[1], chosen[2]]
    confirmed = []

    def confirm(plan, net, xs, budget_s):
        confirmed.append((plan.plan, net.plan))
        return speedup
    monkeypatch.setattr(rf, "_confirm", confirm)
    out, report = rf.weigh_plans(part, chosen, other, assemble or PlanNet, [torch.zeros(1)],
                                 prebuild, budget_s=0.0, key=key)
    return out, report, chosen, other, confirmed


def test_the_one_layout_plan_runs_where_it_is_faster_end_to_end(monkeypatch):
    out, report, chosen, other, confirmed = run_weigh(monkeypatch, 1.08)
    assert confirmed == [(chosen, other)] and out == other  # the ILP's plan timed first
    assert report.steps == 1 and report.kept and report.speedup == 1.08
    assert "differs in 1 steps; it ran 1.080x the ILP's plan's speed end to end: the " \
        "one-layout plan kept" in report.describe()


def test_the_ilps_plan_stays_unless_the_other_wins_by_a_third_of_the_margin(monkeypatch):
    out, report, chosen, *_ = run_weigh(monkeypatch, 1 + rf.MARGIN / 4)
    assert out == chosen and not report.kept and "the ILP's plan kept" in report.describe()
    out, report, chosen, other, _ = run_weigh(monkeypatch, 1 + rf.MARGIN / 3)
    assert out == other and report.kept


def test_equal_plans_or_an_unbuildable_one_weigh_nothing(monkeypatch):
    def never(plan):
        raise AssertionError("nothing to weigh assembles no network")
    out, report, chosen, _, confirmed = run_weigh(monkeypatch, 2.0, assemble=never, same=True)
    assert out == chosen and report.steps == 0 and not confirmed
    assert "the ILP's plan is the one-layout plan" in report.describe()
    asked = []
    out, report, chosen, _, confirmed = run_weigh(
        monkeypatch, 2.0, assemble=never, prebuild=lambda pairs: asked.extend(pairs) or {pairs[0]})
    assert asked == [("k0", "u0")] and out == chosen and not confirmed
    assert report.speedup is None and "not all of its kernels build" in report.describe()


def test_a_weighing_is_recalled_by_the_next_compile(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    for speedup in (1.10, 0.95):  # kept, then (under another key) not kept
        out, report, chosen, other, _ = run_weigh(monkeypatch, speedup, key=f"k{speedup}")
        assert not report.recalled

        def never(plan):
            raise AssertionError("a recalled weighing assembles no network")
        again, report, *_ = run_weigh(monkeypatch, speedup, key=f"k{speedup}", assemble=never)
        assert report.recalled and again == out and report.speedup == speedup
        assert report.kept == (speedup > 1) and "recalled" in report.describe()


# ------------------------------------------------------------------------- for real

class Convs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 32, 1)
        self.b = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.c = torch.nn.Conv2d(32, 16, 1)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def nhwc_records(model, inputs, per_task: int, threads: int = 1):
    """Up to `per_task` direct configs of each task that read and write NHWC, measured:
    one layout pair with several records each, for refine to weigh."""
    cpu, rng, out = cpu_info(), random.Random(0), []
    opts = MeasureOptions(threads=threads, min_repeat_ms=1, repeats=3)
    for task in rk.extract_tasks(model, inputs):
        space = space_for(task.compute, cpu)
        configs = []
        for _ in range(2000):
            cfg = space.sample(rng)
            src, dst = layouts_of(task, cfg)
            if cfg.get("algorithm", "direct") == "direct" and src.startswith("NHWC") and \
                    dst.startswith("NHWC") and cfg not in configs:
                configs.append(cfg)
            if len(configs) == per_task:
                break
        for cfg in configs:
            built = build_for(task.compute, cfg)
            out.append(record_of(task.key, "llvm", cpu.name, cfg.to_json(),
                                 measure_built(task.compute, cfg, built.library, opts,
                                               built.seconds), threads))
    return out


@pytest.fixture(scope="module")
def convs():
    torch.manual_seed(0)
    model, inputs = Convs().eval(), (torch.randn(1, 8, 14, 14),)
    return model, inputs, nhwc_records(model, inputs, per_task=3)


def best_plan(convs):
    """The partition, each step on its task's fastest record, and the records."""
    model, inputs, records = convs
    part = partition(rk.capture(model, inputs))
    best = {}
    for r in records:
        if r.task_key not in best or r.median < best[r.task_key].median:
            best[r.task_key] = r
    chosen = [Candidate(*layouts_of(part.task(s.key), Config.from_json(best[s.key].config)),
                        best[s.key].median, Config.from_json(best[s.key].config))
              for s in part.steps]
    return part, chosen, records


def test_alternatives_share_the_plans_layouts_and_come_fastest_first(convs):
    part, chosen, records = best_plan(convs)
    alts = rf.alternatives(part, chosen, records, layouts_of, 1, 8, lambda s, c: False)
    assert set(alts) == set(range(len(part.steps)))
    for i, a in alts.items():
        assert a[0] is chosen[i] and 1 < len(a) <= 3
        assert len({c.config for c in a}) == len(a)
        assert all((c.in_layout, c.out_layout) == (a[0].in_layout, a[0].out_layout) for c in a)
        assert [c.seconds for c in a[1:]] == sorted(c.seconds for c in a[1:])
    # records at another thread count, or capped at one: nothing to weigh
    assert rf.alternatives(part, chosen, records, layouts_of, 2, 8, lambda s, c: False) == {}
    assert rf.alternatives(part, chosen, records, layouts_of, 1, 1, lambda s, c: False) == {}
    two = rf.alternatives(part, chosen, records, layouts_of, 1, 2, lambda s, c: False)
    assert all(len(a) == 2 for a in two.values())


def test_the_plans_prefetch_twin_is_weighed_second(convs):
    """A 1x1 conv's kernel with prefetch_b turned the other way comes right after the
    plan's, at its record's time where there is one, else at the plan's; the depthwise
    conv has no such knob and gets records only."""
    part, chosen, records = best_plan(convs)
    alts = rf.alternatives(part, chosen, records, layouts_of, 1, 8, lambda s, c: False,
                           prefetch_twin)
    plain = rf.alternatives(part, chosen, records, layouts_of, 1, 8, lambda s, c: False)
    for i, a in alts.items():
        twin = prefetch_twin(part.task(part.steps[i].key).compute, chosen[i].config)
        if part.task(part.steps[i].key).compute.attr("groups") != 1:
            assert twin is None and a == plain[i]
            continue
        assert a[1].config == twin and twin.get("prefetch_b") != chosen[i].config.get(
            "prefetch_b", 0)
        assert (a[1].in_layout, a[1].out_layout) == (a[0].in_layout, a[0].out_layout)
        timed = [r.median for r in records if Config.from_json(r.config) == twin]
        assert a[1].seconds == min(timed, default=chosen[i].seconds)
        assert [c.config for c in a[2:]] == [c.config for c in plain[i][1:] if c.config != twin]
    assert sum(a[1].config.get("prefetch_b") is not None for a in alts.values()) == 2
    # with room for one kernel only, there is nothing to weigh
    assert rf.alternatives(part, chosen, records, layouts_of, 1, 1, lambda s, c: False,
                           prefetch_twin) == {}


def test_the_report_counts_the_steps_that_turned_one_knob():
    plan = [Candidate("NHWC", "NHWC", 1.0, Config.of(ob=16, unroll=True)),
            Candidate("NHWC", "NHWC", 1.0, Config.of(ob=16, unroll=True, prefetch_b=0)),
            Candidate("NHWC", "NHWC", 1.0, Config.of(ob=16, unroll=True))]
    picked = [Candidate("NHWC", "NHWC", 1.0, Config.of(ob=16, unroll=True, prefetch_b=1024)),
              Candidate("NHWC", "NHWC", 1.0, Config.of(ob=32, unroll=True, prefetch_b=0)),
              Candidate("NHWC", "NHWC", 1.0, Config.of(ob=32, unroll=False))]
    # a config without the knob counts as its default (prefetch_b 0)
    assert rf._turned(plan, picked, [0, 1, 2]) == {"prefetch_b": 1, "ob": 1}
    report = rf.Refined(variants=3, steps=3, changed=["a", "b", "c"], speedup=1.1,
                        turned={"prefetch_b": 1, "ob": 1})
    assert "3 of 3 steps changed, 1 only in ob, 1 only in prefetch_b (end to end 1.100x" \
        in report.describe()


def test_a_refined_network_is_checked_and_says_what_it_weighed(convs, monkeypatch,
                                                              tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # nothing weighed here before
    model, inputs, records = convs
    net = compile_network(model, inputs, records, refine=3)  # checked against the model
    assert net.refined is not None and net.refined.variants == 3 and net.refined.steps == 3
    assert not net.refined.recalled
    again = compile_network(model, inputs, records, refine=3)  # the same kernels, recalled
    assert again.refined.recalled and again.refined.changed == net.refined.changed
    assert [s.kernel.library for s in again.steps if s.kernel] == \
        [s.kernel.library for s in net.steps if s.kernel]
    assert net.refined.after_s <= net.refined.before_s
    x = torch.randn(1, 8, 14, 14)
    with torch.no_grad():
        want = model(x)
    assert torch.allclose(net(x), want, atol=1e-4, rtol=1e-4)
    plain = compile_network(model, inputs, records, refine=0)
    assert plain.refined is None
    assert torch.allclose(plain(x), want, atol=1e-4, rtol=1e-4)


def test_a_compile_runs_the_one_layout_plan_where_it_ran_faster(convs, monkeypatch,
                                                                tmp_path):
    """The ILP's plan (here: step 0 on another of its records) and the one-layout plan
    differ; compile_network builds both, keeps the faster, checks it and recalls it."""
    from raytune_kernels.compile import cpu_network
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    model, inputs, records = convs
    real = cpu_network.choose

    def choose(part, cands, layout, *args):
        plan, chosen = real(part, cands, layout, *args)
        if layout == "ilp":  # the ILP's plan runs another of step 0's records
            chosen, task = list(chosen), part.task(part.steps[0].key)
            cfg = next(c for r in records if r.task_key == task.key and
                       (c := Config.from_json(r.config)) != chosen[0].config)
            chosen[0] = Candidate(*layouts_of(task, cfg), 1e-3, cfg)
        return plan, chosen
    monkeypatch.setattr(cpu_network, "choose", choose)
    monkeypatch.setattr(rf, "_confirm", lambda a, b, xs, budget_s: 1.5)
    net = compile_network(model, inputs, records, refine=2)  # checked against the model
    assert net.weighed.steps == 1 and net.weighed.kept and not net.weighed.recalled
    uniform = compile_network(model, inputs, records, refine=2, layout="uniform")
    assert uniform.weighed is None
    assert [s.kernel.library for s in net.steps if s.kernel] == \
        [s.kernel.library for s in uniform.steps if s.kernel]
    again = compile_network(model, inputs, records, refine=2)
    assert again.weighed.recalled and again.weighed.kept
    x = torch.randn(1, 8, 14, 14)
    with torch.no_grad():
        assert torch.allclose(again(x), model(x), atol=1e-4, rtol=1e-4)
    assert compile_network(model, inputs, records, refine=0).weighed is None


@pytest.fixture(scope="module")
def split_records():
    """Per task of Convs, two direct configs of one layout pair measured at 2 threads: one
    splitting channels first between the threads, its times set to half the other's so
    the plan picks it (halving its own left it slower where it measured over twice the
    other's), and one splitting rows first."""
    torch.manual_seed(0)
    model, inputs = Convs().eval(), (torch.randn(1, 8, 14, 14),)
    cpu, rng, out = cpu_info(), random.Random(1), []
    opts = MeasureOptions(threads=2, min_repeat_ms=1, repeats=3)
    for task in rk.extract_tasks(model, inputs):
        space, found = space_for(task.compute, cpu), {}
        for _ in range(5000):
            cfg = space.sample(rng)
            axis, pair = rf.split_axis(cfg), layouts_of(task, cfg)
            if cfg.get("algorithm", "direct") == "direct" and axis in ("ko", "oh") and \
                    axis not in found and pair == found.get("ko", (None, pair))[1]:
                found[axis] = (cfg, pair)
            if len(found) == 2:
                break
        assert set(found) == {"ko", "oh"}, task.key
        measured = {}
        for axis, (cfg, _) in found.items():
            built = build_for(task.compute, cfg)
            measured[axis] = record_of(task.key, "llvm", cpu.name, cfg.to_json(), measure_built(
                task.compute, cfg, built.library, opts, built.seconds), 2)
        out += [dataclasses.replace(measured["ko"],
                                    times=tuple(t / 2 for t in measured["oh"].times)),
                measured["oh"]]
    return model, inputs, out


def test_an_agreed_network_is_checked_and_recalled(split_records, monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    model, inputs, records = split_records
    net = compile_network(model, inputs, records, threads=2, refine=2)  # checked
    # every step with another record of its layouts (and bordering) was offered its row
    # split: by refine (its only other record) or by the agreement; a step refine turned
    # to its kernel's prefetch twin still splits channels, and is offered rows after
    assert net.agreed is not None and not net.agreed.recalled
    to_rows = len(net.refined.changed) - net.refined.turned.get("prefetch_b", 0)
    assert net.agreed.steps + to_rows == net.refined.steps >= 1
    assert net.agreed.kept <= net.agreed.steps
    again = compile_network(model, inputs, records, threads=2, refine=2)
    assert again.agreed.recalled == (net.agreed.steps > 0)
    assert again.agreed.kept == net.agreed.kept
    assert [s.kernel.library for s in again.steps if s.kernel] == \
        [s.kernel.library for s in net.steps if s.kernel]
    x = torch.randn(1, 8, 14, 14)
    with torch.no_grad():
        assert torch.allclose(again(x), model(x), atol=1e-4, rtol=1e-4)
    assert compile_network(model, inputs, records, threads=2, refine=0).agreed is None


@pytest.mark.parametrize("bad", [-1, 2.5, True, "8"])
def test_a_bad_refine_count_is_named(convs, bad):
    model, inputs, records = convs
    with pytest.raises(CompileError, match="refine must be a count of records"):
        compile_network(model, inputs, records, refine=bad)


# ------------------------------------------------------------ convs reading NHWC as it is

class Blocks(torch.nn.Module):
    """Two direct convs, the second reading what the first wrote, with a border."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 16, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(scope="module")
def blocks():
    """Blocks with one measured record per conv: the first writing NHWC, the second reading
    blocks of 8 of its 32 channels (NCHW8c): as planned, a copy runs between them."""
    torch.manual_seed(0)
    model, inputs = Blocks().eval(), (torch.randn(1, 8, 10, 12),)
    cpu, rng, records = cpu_info(), random.Random(0), []
    opts = MeasureOptions(threads=1, min_repeat_ms=1, repeats=3)
    wanted = [lambda src, dst: dst == "NHWC", lambda src, dst: src == "NCHW8c/p1x1"]
    for task, want in zip(rk.extract_tasks(model, inputs), wanted):
        space = space_for(task.compute, cpu)
        cfg = next(c for c in (space.sample(rng) for _ in range(5000))
                   if c.get("algorithm", "direct") == "direct" and want(*layouts_of(task, c)))
        built = build_for(task.compute, cfg)
        records.append(record_of(task.key, "llvm", cpu.name, cfg.to_json(), measure_built(
            task.compute, cfg, built.library, opts, built.seconds), 1))
    return model, inputs, records


def test_a_conv_after_an_nhwc_producer_reads_it_as_it_is(blocks):
    """nhwc_reads turns exactly the readers of NHWC values that read channel blocks: the
    second conv reads NHWC (its border kept), its kernel otherwise the same config."""
    from raytune_kernels.compile.cpu_plan import nhwc_reads

    model, inputs, records = blocks
    part = partition(rk.capture(model, inputs))
    chosen = [Candidate(*layouts_of(part.task(s.key), c), 1e-3, c) for s, c in
              zip(part.steps, [Config.from_json(r.config) for r in records])]
    fused = nhwc_reads(part, chosen)
    assert fused[0] == chosen[0] and fused[0].config == chosen[0].config
    assert (fused[1].in_layout, fused[1].out_layout) == ("NHWC/p1x1", chosen[1].out_layout)
    assert dict(fused[1].config.knobs) == {**dict(chosen[1].config.knobs), "in_layout": "nhwc"}
    space, rng = space_for(part.task(part.steps[0].key).compute, cpu_info()), random.Random(1)
    samples = [c for c in (space.sample(rng) for _ in range(3000))
               if c.get("algorithm", "direct") == "direct"]

    def writing(dst):  # the first conv on a config of its own writing `dst`
        cfg = next(c for c in samples if layouts_of(part.task(part.steps[0].key), c)[1] == dst)
        return [Candidate(*layouts_of(part.task(part.steps[0].key), cfg), 1e-3, cfg)]
    # blocks of 16 the reader takes 8 at a time: written NHWC and read so, no copy left
    turned = nhwc_reads(part, writing("NCHW16c") + chosen[1:])
    assert (turned[0].out_layout, turned[0].config["out_layout"]) == ("NHWC", "nhwc")
    assert turned[1] == fused[1]
    # blocks of 8 read as they are: nothing to turn
    same = writing("NCHW8c") + chosen[1:]
    assert nhwc_reads(part, same) == same


def _native_nhwc(task, out_layout: str, seed: int = 2) -> Config:
    """A direct config of the task whose block spans every channel: it reads NHWC as is."""
    space, rng = space_for(task.compute, cpu_info()), random.Random(seed)
    return next(c for c in (space.sample(rng) for _ in range(5000))
                if c.get("algorithm", "direct") == "direct" and
                layouts_of(task, c) == ("NHWC/p1x1", out_layout))


def test_a_conv_reading_blocks_is_offered_reading_nhwc_where_no_record_reads_it_as_fast(
        blocks):
    """nhwc_twins: each candidate reading channel blocks gets a twin reading NHWC, priced
    as its record timed the original, unless a candidate that reads NHWC and writes the
    same layout is as fast; a candidate already reading NHWC has none."""
    from raytune_kernels.compile.cpu_network import nhwc_twins

    model, inputs, records = blocks
    task = rk.extract_tasks(model, inputs)[1]
    cfg = Config.from_json(records[1].config)
    blocked = Candidate(*layouts_of(task, cfg), 1e-3, cfg)
    (twin,) = nhwc_twins(task, [blocked])
    assert (twin.in_layout, twin.out_layout, twin.seconds) == \
        ("NHWC/p1x1", blocked.out_layout, 1e-3)
    assert dict(twin.config.knobs) == {**dict(cfg.knobs), "in_layout": "nhwc"}
    native = _native_nhwc(task, blocked.out_layout)

    def reading_nhwc(seconds):
        return Candidate(*layouts_of(task, native), seconds, native)
    assert nhwc_twins(task, [blocked, reading_nhwc(1e-3)]) == []
    assert nhwc_twins(task, [blocked, reading_nhwc(2e-3)]) == [twin]
    assert nhwc_twins(task, [reading_nhwc(2e-3)]) == []


def test_an_untuned_step_keeps_its_checked_kernel_when_convs_are_offered_reading_nhwc(
        blocks):
    """_with_twins: a step held to the kernel its isolated check passed (an untuned one)
    is offered nothing else, no twin either; the others get their twins; a plan with no
    twin to offer gives None."""
    from raytune_kernels.compile.cpu_network import _with_twins

    model, inputs, records = blocks
    part = partition(rk.capture(model, inputs))
    cands = [[Candidate(*layouts_of(part.task(s.key), c), 1e-3, c)] for s, c in
             zip(part.steps, [Config.from_json(r.config) for r in records])]
    offered = _with_twins(part, cands)
    assert [len(cs) for cs in offered] == [2, 2]
    assert all(cs[1].config.get("in_layout") == "nhwc" for cs in offered)
    held = _with_twins(part, cands, {0: cands[0][0]})
    assert held[0] == cands[0] and held[1] == offered[1]
    assert _with_twins(part, cands, {0: cands[0][0], 1: cands[1][0]}) is None


def _twin_plans(blocks, ratios, monkeypatch, tmp_path):
    """_timed_twins over blocks' two convs, each with one record and its twin: a plan
    takes the cheapest candidate of each step, a read of NHWC counted 0.5 ms cheaper
    (the copy it saves), and the timer gives each twin `ratios[step]` times its
    original's time (None: it fails). Returns the result, the plans' offers and the
    timer's calls."""
    from raytune_kernels.compile.cpu_network import _timed_twins, _with_twins

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    model, inputs, records = blocks
    part = partition(rk.capture(model, inputs))
    cands = [[Candidate(*layouts_of(part.task(s.key), c), 1e-3, c)] for s, c in
             zip(part.steps, [Config.from_json(r.config) for r in records])]
    offers, calls = [], []

    def plan_of(offered):
        offers.append(offered)
        return "plan", [min(cs, key=lambda c: c.seconds - 5e-4 * c.in_layout.startswith(
            "NHWC")) for cs in offered]

    def timer(items, opts, child=None):
        calls.append(items)
        steps = [next(i for i, s in enumerate(part.steps) if part.task(s.key).compute == c)
                 for c, _ in items[::2]]
        return [t for i in steps for t in (
            2e-3, 2e-3 * ratios[i] if ratios[i] is not None else float("inf"))]
    out = _timed_twins(part, cands, _with_twins(part, cands), plan_of,
                       MeasureOptions(threads=1), None, timer)
    return part, cands, out, offers, calls


def test_a_twin_the_plan_takes_is_timed_and_priced_by_its_ratio_to_its_original(
        blocks, monkeypatch, tmp_path):
    """_timed_twins: the twins a plan chose are timed beside their originals, priced as
    their records times that ratio, and the plan solved again; a twin twice as slow as
    its original loses the copy it saves, one 1.2x as slow keeps it, a failing one is not
    offered again; a second compile recalls the ratios and times nothing."""
    part, cands, (plan, chosen, ratios), offers, calls = _twin_plans(
        blocks, [2.0, 1.2], monkeypatch, tmp_path)
    assert len(offers) == 2 and len(calls) == 1 and len(calls[0]) == 4
    assert chosen[0] is cands[0][0]  # the first conv's twin, 2 ms, loses to its record
    assert chosen[1].config.get("in_layout") == "nhwc" and chosen[1].seconds == \
        pytest.approx(1.2e-3)
    assert sorted(ratios.values()) == pytest.approx([1.2, 2.0])
    assert [c.seconds for c in offers[1][0]] == pytest.approx([1e-3, 2e-3])
    _, _, (_, _, again), _, calls = _twin_plans(blocks, [None, None], monkeypatch, tmp_path)
    assert calls == [] and again == ratios  # recalled from this machine's cache
    _, cands, (_, chosen, ratios), offers, _ = _twin_plans(
        blocks, [None, 1.0], monkeypatch, tmp_path / "failing")
    assert ratios[part.steps[0].key, offers[0][0][1].config] == float("inf")
    assert len(offers[1][0]) == 1 and chosen[0] is cands[0][0]


def test_the_last_plan_takes_no_twin_untimed(blocks, monkeypatch, tmp_path):
    """With one plan allowed, no twin is timed and none is offered to it."""
    from raytune_kernels.compile import cpu_network

    monkeypatch.setattr(cpu_network, "TWIN_PLANS", 1)
    _, cands, (_, chosen, ratios), offers, calls = _twin_plans(
        blocks, [1.0, 1.0], monkeypatch, tmp_path)
    assert calls == [] and ratios == {} and offers == [cands] and chosen == \
        [cs[0] for cs in cands]


def test_kernels_timed_in_a_child_give_their_seconds_or_inf(blocks):
    """probe.time_isolated: a record's kernel and its twin, checked and timed in a child,
    take finite seconds; a config that does not lower takes inf."""
    from raytune_kernels.cpu.probe import time_isolated
    from raytune_kernels.cpu.schedules import nhwc_reader

    model, inputs, records = blocks
    task = rk.extract_tasks(model, inputs)[1]
    cfg = Config.from_json(records[1].config)
    broken = Config(tuple(sorted({**dict(cfg.knobs), "lanes": 7}.items())))
    seconds = time_isolated([(task.compute, cfg), (task.compute, nhwc_reader(task.compute,
                                                                            cfg)),
                             (task.compute, broken)],
                            MeasureOptions(threads=1, min_repeat_ms=1, repeats=3))
    assert all(0 < t < 0.1 for t in seconds[:2]) and seconds[2] == float("inf")


@pytest.fixture(scope="module")
def slow_nhwc(blocks):
    """blocks' records and one more of the second conv, reading NHWC as it is, timed just
    slower than its record reading blocks: the layout plan takes it over the copy."""
    model, inputs, records = blocks
    task = rk.extract_tasks(model, inputs)[1]
    cfg = _native_nhwc(task, layouts_of(task, Config.from_json(records[1].config))[1])
    built = build_for(task.compute, cfg)
    timed = measure_built(task.compute, cfg, built.library,
                          MeasureOptions(threads=1, min_repeat_ms=1, repeats=3), built.seconds)
    timed = dataclasses.replace(timed, times=tuple(1.05 * t for t in records[1].times))
    return model, inputs, records + [record_of(task.key, "llvm", cpu_info().name,
                                               cfg.to_json(), timed, 1)]


def _twins_time_as_their_originals(monkeypatch):
    """Each twin timed (_timed_twins) as fast as its original: the plans below rest on the
    twin's price, not on how this host times it."""
    from raytune_kernels.cpu import probe

    monkeypatch.setattr(probe, "time_isolated",
                        lambda items, opts, mcpu=None, child=None: [1e-3] * len(items))


@pytest.mark.parametrize("speedup", [1.5, 0.9])
def test_a_compile_weighs_a_conv_reading_nhwc_in_blocks_against_its_slower_record(
        slow_nhwc, monkeypatch, tmp_path, speedup):
    """Where the plan's conv reads NHWC with a kernel slower than a record that reads
    blocks, no copy is left for nhwc_reads to drop: the layout plan, offered that record
    reading NHWC (nhwc_twins), is weighed against it end to end, and the faster runs."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    _twins_time_as_their_originals(monkeypatch)
    model, inputs, records = slow_nhwc
    monkeypatch.setattr(rf, "_confirm", lambda a, b, xs, budget_s: speedup)
    net = compile_network(model, inputs, records, refine=2)  # checked against the model
    # the second conv (and perhaps the first, reading the input NHWC) changes
    assert net.nhwc_reads.steps in (1, 2) and net.nhwc_reads.kept == (speedup > 1)
    assert sum(s.kind == "transform" for s in net.steps) == 2  # the input's and output's
    x = torch.randn(1, 8, 10, 12)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("speedup", [1.5, 0.9])
def test_a_compile_drops_the_copy_where_the_network_runs_faster_without_it(
        blocks, monkeypatch, tmp_path, speedup):
    """compile_network weighs the plan whose conv reads NHWC against the plan with the
    copy, runs the faster (checked against the model), and recalls the choice."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    _twins_time_as_their_originals(monkeypatch)
    model, inputs, records = blocks
    monkeypatch.setattr(rf, "_confirm", lambda a, b, xs, budget_s: speedup)
    net = compile_network(model, inputs, records, refine=2)  # checked against the model
    kept = speedup > 1
    # the second conv reads NHWC; the first may too, its copy of the input turned into one
    # to NHWC instead (nhwc_twins), as the measured copies price it
    assert net.nhwc_reads.steps in (1, 2) and net.nhwc_reads.kept == kept
    assert not net.nhwc_reads.recalled
    assert ("they do" if kept else "the copies kept") in net.nhwc_reads.describe()
    names = [s.name for s in net.steps]
    assert ("relu: NHWC -> NCHW8c/p1x1" in names) != kept, names
    assert sum(s.kind == "transform" for s in net.steps) == (2 if kept else 3), names
    monkeypatch.setattr(rf, "_confirm", lambda *a: pytest.fail("a recalled choice times"))
    again = compile_network(model, inputs, records, refine=2)
    assert again.nhwc_reads.recalled and again.nhwc_reads.kept == kept
    x = torch.randn(1, 8, 10, 12)
    with torch.no_grad():
        assert torch.allclose(again(x), model(x), atol=1e-4, rtol=1e-4)
    assert compile_network(model, inputs, records, refine=0).nhwc_reads is None
