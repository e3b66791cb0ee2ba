"""How the pipeline shares a small machine's cores between builds and measurements."""
import os
import random

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.schedules import space_for
from raytune_kernels.measure import MeasureOptions

OPTS = MeasureOptions(threads=1, min_repeat_ms=5, repeats=3, timeout_s=8)
CORES = tuple(sorted(os.sched_getaffinity(0)))[:2]


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores")
def test_one_measurer_on_two_cores_builds_on_both_between_measurements(ray_session):
    """One core free beside one measuring: building on both, then measuring, beats one
    builder beside an idle measurer (bench/scaling.py). Asked to overlap, the pipeline
    does; asked to overlap with no core free of measurement, it refuses by name."""
    from actors.pipeline import MeasurePipeline

    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU())
    task = rk.extract_tasks(model.eval(), (torch.randn(1, 16, 10, 10),))[0]
    space, rng = space_for(task.compute, cpu_info()), random.Random(3)
    items = [(task, space.sample(rng)) for _ in range(4)]
    for phased, builders in ((None, 2), (False, 1)):
        pipe = MeasurePipeline(num_measurers=1, opts=OPTS, cores=CORES, phased=phased)
        try:
            assert pipe.phased == (phased is None) and len(pipe.builders) == builders
            results = pipe.run(items)
            assert all(r.ok for r in results), [r.error_msg for r in results]
        finally:
            pipe.shutdown()
    with pytest.raises(ValueError, match="need a core no measurer owns"):
        MeasurePipeline(num_measurers=2, opts=OPTS, cores=CORES, phased=False)


def test_phased_builds_go_to_whichever_builder_is_free(ray_session):
    """A slow build does not hold back the candidates behind it: the other builder takes
    them all (in turn, it would have been handed every other one)."""
    import time
    import types

    import ray
    from actors.pipeline import MeasurePipeline

    @ray.remote
    def build(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    handed: dict[int, list[int]] = {0: [], 1: []}
    secs = [3.0, 0.05, 0.05, 0.05, 0.05, 0.05]

    def submit(self, item, k=None):
        handed[k].append(item)
        return build.remote(secs[item])

    fake = types.SimpleNamespace(builders=[None, None], opts=OPTS, spare_cores=0)
    fake._build = types.MethodType(submit, fake)
    refs = MeasurePipeline._build_pulled(fake, list(range(len(secs))))
    assert ray.get(refs) == secs
    assert handed == {0: [0], 1: [1, 2, 3, 4, 5]}


@pytest.mark.e2e  # a timed pipeline run
def test_measuring_starts_when_the_last_builds_fit_on_the_spare_cores(ray_session):
    """With a core no measurer owns, the batch does not wait for its slowest build: once
    nothing is left to hand out and the builds still running fit on the spare cores, the
    builds go to measurement (the rest arrive as they finish)."""
    import time
    import types

    import ray
    from actors.pipeline import MeasurePipeline

    @ray.remote
    def build(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    # Two workers up before the clock matters: a cold worker's start is not the pipeline's.
    ray.get([build.remote(0.5), build.remote(0.5)])
    secs = [5.0, 0.05, 0.05, 0.05]
    fake = types.SimpleNamespace(builders=[None, None], opts=OPTS)
    fake._build = types.MethodType(lambda self, i, k=None: build.remote(secs[i]), fake)
    for spare, waits in ((1, False), (0, True)):
        fake.spare_cores = spare
        refs = MeasurePipeline._build_pulled(fake, list(range(len(secs))))
        # Whether the slowest build had finished when measuring could start, not a wall time
        # (a loaded host takes seconds to start the short builds' workers).
        slow_done, _ = ray.wait([refs[0]], timeout=0)
        assert bool(slow_done) == waits
        assert ray.get(refs) == secs
