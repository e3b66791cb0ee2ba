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
