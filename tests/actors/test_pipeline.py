"""The real actor path: builders, measurers, crash and hang isolation, timing honesty."""
import json
import random
import subprocess
import sys
import textwrap

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu import faults
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.schedules import space_for
from raytune_kernels.space import Config
from raytune_kernels.measure import MeasureOptions

OPTS = MeasureOptions(threads=1, min_repeat_ms=5, repeats=3, timeout_s=8)


@pytest.fixture(scope="module")
def task():
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU())
    return rk.extract_tasks(model.eval(), (torch.randn(1, 32, 14, 14),))[0]


@pytest.fixture(scope="module")
def configs(task):
    space = space_for(task.compute, cpu_info())
    rng = random.Random(0)
    return [space.sample(rng) for _ in range(6)]


@pytest.fixture(scope="module")
def pipeline(ray_session):
    from actors.pipeline import MeasurePipeline
    p = MeasurePipeline(num_measurers=1, opts=OPTS)
    yield p
    p.shutdown()


def fault_library(task, cfg: Config, kind: str):
    """A library exporting the kernel symbol the measurer expects, doing `kind` instead."""
    result = faults.fault_library(task.compute, cfg, kind)
    assert result.error is None, result.error
    return result


def test_batch_of_real_candidates(pipeline, task, configs):
    results = pipeline.run([(task, c) for c in configs])
    assert all(r.ok for r in results), [r.error_msg for r in results if not r.ok]
    assert all(r.build_s > 0 and len(r.times) == 3 for r in results)


def test_a_stream_of_rounds_returns_each_round_once_with_its_own_results(pipeline, task,
                                                                         configs, monkeypatch):
    """launch() adds rounds while others are measured; wait() hands back each finished
    round once, its results in its own order, and lets go of its builds; a batch cannot
    run while the stream is open. (This machine's pipeline builds on the measurer's core
    between measurements; a stream builds beside them, which only its timings would mind.)"""
    with pytest.raises(RuntimeError, match="needs builders on cores no measurer owns"):
        pipeline.launch([(task, configs[0])])
    monkeypatch.setattr(pipeline, "phased", False)
    rounds = [configs[0:2], configs[2:5], configs[5:6]]
    handles = [pipeline.launch([(task, c) for c in cfgs]) for cfgs in rounds[:2]]
    got = dict(pipeline.wait(handles))
    handles = [h for h in handles if h not in got] + [
        pipeline.launch([(task, c) for c in rounds[2]])]
    with pytest.raises(RuntimeError, match="stream of rounds is open"):
        pipeline.run([(task, configs[0])])
    while handles:
        for h, results in pipeline.wait(handles):
            assert h not in got
            got[h] = results
            handles.remove(h)
    assert sorted(got) == [0, 1, 2]
    for h, cfgs in enumerate(rounds):
        assert len(got[h]) == len(cfgs) and all(r.ok for r in got[h]), got[h]
    assert all(b is None for b in pipeline._builds) and not pipeline._build_node
    with pytest.raises(KeyError, match="no round in flight"):
        pipeline.wait([0])
    pipeline.close_stream()
    monkeypatch.undo()
    assert pipeline.run([(task, configs[0])])[0].ok


def test_stats_add_up_where_each_trial_went(pipeline, task, configs):
    """Every phase of a batch of fresh candidates (not in the builders' cache) lands in
    the stats, the builders' adding up to the builds' seconds and the measurers' to their
    runs; what is left of each trial's time is Ray's and the pipeline's queue."""
    import dataclasses

    space, rng = space_for(task.compute, cpu_info()), random.Random(1)
    fresh = list(dict.fromkeys(c for c in (space.sample(rng) for _ in range(40))
                               if c not in configs))
    warm, fresh = fresh[3:3 + len(pipeline.builders)], fresh[:3]
    # a builder's first build also sets LLVM up (outside the build's phases): every
    # builder builds once first, whichever test ran before this one
    pipeline.run([(task, c) for c in warm])
    before = dataclasses.replace(pipeline.stats)
    results = pipeline.run([(task, c) for c in fresh])
    assert all(r.ok for r in results), [r.error_msg for r in results if not r.ok]
    now = pipeline.stats
    spent = {k: v - before.phase_seconds()[k] for k, v in now.phase_seconds().items()}
    assert now.timed_trials - before.timed_trials == 3
    assert all(spent[k] > 0 for k in ("render", "optimize", "codegen", "link", "load",
                                      "check", "timing", "call")), spent
    assert spent["queue"] >= 0
    building = sum(spent[k] for k in ("render", "optimize", "codegen", "link"))
    assert building == pytest.approx(sum(r.build_s for r in results), rel=0.02)
    measuring = sum(spent[k] for k in ("load", "check", "timing"))
    assert measuring == pytest.approx(sum(r.run_s for r in results), rel=0.02)
    # each trial's phases fit in the batch's wall time, which its submission opened
    assert sum(spent.values()) <= 3 * (now.wall_s - before.wall_s)


@pytest.mark.e2e
def test_injected_faults_become_error_kinds_and_the_pool_survives(pipeline, task, configs):
    good = configs[0]
    from raytune_kernels.cpu.kernel import build_for
    built = [fault_library(task, good, "segfault"), fault_library(task, good, "hang"),
             build_for(task.compute, good), fault_library(task, good, "wrong"),
             fault_library(task, good, "nan")]
    results = pipeline.measure_built([(task, good)] * len(built), built)
    kinds = [r.error_kind for r in results]
    assert kinds == ["crashed", "timeout", None, "wrong_output", "non_finite"], \
        [(r.error_kind, r.error_msg) for r in results]
    assert results[2].median < 0.05
    after = pipeline.run([(task, c) for c in configs[:2]])  # healthy afterwards
    assert all(r.ok for r in after)


def test_build_errors_are_data(pipeline, task):
    bad = Config.of(lanes=16, ob=48, tile_h=5, tile_w=3, cb=7, spatial_order=("ko", "oh", "ow"),
                    reduce_order=("co", "kh", "kw"), parallel=1, unroll=False)
    (result,) = pipeline.run([(task, bad)])
    assert result.error_kind == "build_error" and "ob=48" in result.error_msg


@pytest.mark.timing
def test_measurer_time_agrees_with_standalone_timing(pipeline, task, configs):
    """The same kernel, same protocol, same core: in the measurer actor and in a fresh
    process. A shared VM core is noisy (a neighbour's burst slows one side of a pair), so
    a disagreement is measured again, up to four pairs, and the fastest time of each side
    so far is compared: noise only ever adds time, a systematic difference stays."""
    cfg = configs[1]
    opts = MeasureOptions(threads=1, min_repeat_ms=60, repeats=5)
    pairs = []
    for _ in range(4):
        pipeline.opts = opts
        try:
            via_actor = pipeline.run([(task, cfg)])[0].median
        finally:
            pipeline.opts = OPTS
        standalone = _standalone(task, cfg, pipeline.slots[0].cores)
        pairs.append((via_actor, standalone))
        best_actor, best_alone = min(p[0] for p in pairs), min(p[1] for p in pairs)
        if abs(best_actor - best_alone) / best_alone < 0.10:
            return
    pytest.fail(f"measurer vs standalone seconds differ by more than 10%: {pairs}")


def _standalone(task, cfg, cores) -> float:
    script = textwrap.dedent(f"""
        import json, os, torch
        from raytune_kernels.task import Task
        from raytune_kernels.space import Config
        from raytune_kernels.cpu.kernel import build_for
        from raytune_kernels.cpu.measure import measure_built
        from raytune_kernels.measure import MeasureOptions
        os.sched_setaffinity(0, {tuple(cores)!r})
        torch.set_num_threads(1)
        task = Task.from_json(json.loads({json.dumps(json.dumps(task.to_json()))}))
        cfg = Config.from_json(json.loads({json.dumps(json.dumps(cfg.to_json()))}))
        built = build_for(task.compute, cfg)
        r = measure_built(task.compute, cfg, built.library,
                          MeasureOptions(threads=1, min_repeat_ms=60, repeats=5))
        print(r.median)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.strip().splitlines()[-1])


def test_each_replacement_actor_gets_a_name_of_its_own(pipeline):
    """A builder's maker names every actor it starts anew: a replacement started while Ray
    still holds its killed predecessor's name must not be refused for the name."""
    import ray
    from actors.pipeline import NAMESPACE

    def named():
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == NAMESPACE}

    before = named()
    first, second = (pipeline.builder_makers[0]() for _ in range(2))  # a duplicate name raises
    try:
        names = named() - before
        assert len(names) == 2 and all(n.startswith("builder-") for n in names), names
    finally:
        ray.kill(first, no_restart=True)
        ray.kill(second, no_restart=True)


def test_a_builder_that_dies_mid_batch_is_replaced_and_nothing_hangs(pipeline, task, configs):
    """Builders killed while a batch builds (as an LLVM abort or the OOM killer would):
    fresh builders take their place, their builds are done again, every candidate gets
    its time."""
    import threading
    import time

    import ray
    out, redone, killed = {}, pipeline.stats.redone, list(pipeline.builders)
    worker = threading.Thread(target=lambda: out.update(
        results=pipeline.run([(task, c) for c in configs[:3]])), daemon=True)
    worker.start()
    time.sleep(0.05)
    for builder in killed:
        ray.kill(builder, no_restart=False)
    worker.join(120)
    assert not worker.is_alive(), "the pipeline hung after its builder died"
    assert [r.error_kind for r in out["results"]] == [None] * 3, \
        [r.error_msg for r in out["results"]]
    # a killed builder is replaced when a build on it fails (this batch's or the next's);
    # the next batch builds on every builder (one candidate each, then the rest)
    again = pipeline.run([(task, c) for c in configs[:3]])
    assert [r.error_kind for r in again] == [None] * 3, [r.error_msg for r in again]
    assert not any(b is k for b in pipeline.builders for k in killed)
    assert len(set(ray.get([b.ready.remote() for b in pipeline.builders], timeout=60))) == \
        len(pipeline.builders)  # each alive, in a process of its own
    assert pipeline.stats.redone > redone  # the killed builds were done again (the
    # third config's build, about 0.45 s, is far longer than the 50 ms before the kill)


@pytest.mark.e2e  # a fault waited out on real actors
def test_a_build_past_the_build_timeout_is_a_build_error_and_the_rest_go_on(pipeline, task,
                                                                         configs):
    """A build that never returns (LLVM caught in a loop) is recorded as a build error after
    build_timeout_s, its builder replaced by a fresh actor (not restarted by Ray: calls to
    an actor Ray restarts can stall); the builds queued behind it are built again."""
    import dataclasses
    import time

    import ray

    @ray.remote(max_restarts=-1, max_task_retries=0, num_cpus=0)
    class StallingBuilder:
        def __init__(self):
            import raytune_kernels.cpu.kernel  # noqa: F401  (as BuilderActor's module does)

        def ready(self):
            return 1

        def build(self, compute, config, mcpu):
            from raytune_kernels.cpu.kernel import build_for
            from raytune_kernels.space import Config
            from raytune_kernels.task import Compute
            if config == hang:
                time.sleep(3600)
            return build_for(Compute.from_json(compute), Config.from_json(config), mcpu)

    hang = configs[1].to_json()
    builders, makers = pipeline.builders, pipeline.builder_makers
    opts, timeouts = pipeline.opts, pipeline.stats.build_timeouts
    stalling = StallingBuilder.remote()
    ray.get(stalling.ready.remote())  # started, as the pipeline's builders are
    pipeline.builders = [stalling] * len(builders)
    pipeline.builder_makers = [StallingBuilder.remote] * len(builders)
    pipeline.opts = dataclasses.replace(OPTS, build_timeout_s=4.0)
    try:
        start = time.perf_counter()
        results = pipeline.run([(task, c) for c in configs[:3]])
        assert time.perf_counter() - start < 60
        assert [r.error_kind for r in results] == [None, "build_error", None], \
            [r.error_msg for r in results]
        assert "build ran past 4 s; its builder was restarted" in results[1].error_msg
        assert pipeline.stats.build_timeouts == timeouts + 1
        fresh = pipeline.builders[0]
        assert fresh is not stalling and pipeline.builders == [fresh] * len(builders)
        assert pipeline.run([(task, configs[0])])[0].ok  # the fresh builder builds
        with pytest.raises(ray.exceptions.RayActorError):  # the wedged one is gone for good
            ray.get(stalling.ready.remote(), timeout=30)
    finally:
        for b in set(pipeline.builders) - set(builders):
            ray.kill(b)
        pipeline.builders, pipeline.builder_makers, pipeline.opts = builders, makers, opts
        ray.kill(stalling)


def test_measurers_that_cannot_be_placed_are_an_error_not_a_hang(pipeline, monkeypatch):
    """The module's pipeline holds this Ray session's CPUs: a second one cannot place its
    measurer, and says so instead of waiting forever."""
    import ray
    from actors import pipeline as pipeline_mod

    monkeypatch.setattr(pipeline_mod, "START_TIMEOUT_S", 3.0)
    if ray.available_resources().get("CPU", 0) >= 1:
        pytest.skip("this Ray session has a CPU free")
    with pytest.raises(RuntimeError, match=r"1 measurer\(s\) of 1 CPU\(s\) did not start "
                                           r"within 3 s: Ray has 0 CPU\(s\) free"):
        pipeline_mod.MeasurePipeline(num_measurers=1, opts=OPTS)


def test_a_candidate_whose_build_kills_the_builder_twice_is_a_build_error(pipeline):
    """The first death of a candidate's build may be bad luck (built again), the second is
    the candidate's (recorded); a builder lost with its node is always built again."""
    pipeline._build_deaths = {}
    assert pipeline._build_again(7, object()) is True
    assert pipeline._build_again(7, object()) is False
    assert pipeline._build_again(8, object()) is True


@pytest.mark.e2e  # a fault waited out on real actors
def test_a_measurer_killed_from_outside_does_not_blame_its_candidate(pipeline, task, configs,
                                                                     tmp_path):
    """A measurer killed mid-measurement by someone else (an operator, the OOM killer) is
    restarted by Ray and its candidate measured again: one death is not a crash."""
    import threading
    import time

    import ray

    started = tmp_path / "measuring"  # written by the first measurement, then killed

    @ray.remote(max_restarts=-1, max_task_retries=0, num_cpus=0)
    class SlowMeasurer:
        def ready(self):
            return 1

        def measure(self, compute, config, library, build_s):
            started.touch()
            time.sleep(3)  # long enough to be killed in flight
            return {"times": [1e-3], "error_kind": None, "error_msg": "", "build_s": build_s,
                    "run_s": 3.0}

    def kill_once_measuring():
        end = time.perf_counter() + 60
        while not started.exists() and time.perf_counter() < end:
            time.sleep(0.02)
        ray.kill(slot.actor, no_restart=False)

    slot = pipeline.slots[0]
    real, redone = slot.actor, pipeline.stats.redone
    slot.actor = SlowMeasurer.remote()
    try:
        timer = threading.Thread(target=kill_once_measuring, daemon=True)
        timer.start()
        (result,) = pipeline.run([(task, configs[0])])
        timer.join()
        assert started.exists()
        assert result.ok, (result.error_kind, result.error_msg)
        assert pipeline.stats.redone == redone + 1
    finally:
        ray.kill(slot.actor)
        slot.actor = real


def test_a_full_temp_dir_is_retried_then_recorded_as_the_hosts_fault(pipeline, task, configs,
                                                                    monkeypatch):
    """A build that failed for the machine's sake (ENOSPC) is built again after a wait;
    still failing after the last wait it is a host_error, and a batch of nothing else
    stops the run with the cause instead of burning the budget."""
    import ray
    from actors import pipeline as pipeline_mod
    from raytune_kernels.cpu.build import BuildResult
    from raytune_kernels.cpu.kernel import build_for

    monkeypatch.setattr(pipeline_mod, "HOST_RETRY_WAITS_S", (0.2,))
    full = BuildResult(None, "No space left on device (temp directory /tmp)", 0.0, True)
    redone = pipeline.stats.redone
    results = pipeline.measure_built([(task, configs[0]), (task, configs[1])],
                                     [full, build_for(task.compute, configs[1])])
    assert [r.error_kind for r in results] == [None, None]  # built again, for real
    assert pipeline.stats.redone == redone + 1

    @ray.remote(num_cpus=0)
    class FullDiskBuilder:
        def build(self, compute, config, mcpu):
            return full

    builders = pipeline.builders
    pipeline.builders = [FullDiskBuilder.remote()]
    try:
        with pytest.raises(pipeline_mod.HostFault, match="No space left on device .* free "
                                                         "it and resume"):
            pipeline.run([(task, configs[2])])
        results = pipeline.measure_built([(task, configs[0]), (task, configs[1])],
                                         [full, build_for(task.compute, configs[1])])
        assert [r.error_kind for r in results] == ["host_error", None]
        assert "No space left" in results[0].error_msg
        monkeypatch.setattr(pipeline, "phased", False)  # a stream stops alike
        handle = pipeline.launch([(task, configs[2])])
        with pytest.raises(pipeline_mod.HostFault, match="No space left on device"):
            pipeline.wait([handle])
        pipeline.close_stream()
    finally:
        ray.kill(pipeline.builders[0])
        pipeline.builders = builders
