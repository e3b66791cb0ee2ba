"""The GPU actors on a local Ray without a GPU: the measurer's restart after a poisoned
context (with a fake measure function standing in for the GPU), and the NVRTC builder."""
import random

import pytest

from raytune_kernels.cuda.build import CudaBuildResult, nvrtc_unavailable
from raytune_kernels.cuda.render import cuda_space_for
from raytune_kernels.space import Config
from raytune_kernels.measure import CRASHED, MeasureOptions, MeasureResult

from tests.support.cuda_cases import CASES


def fake_measure(compute, cfg, binary, opts, build_s=0.0) -> MeasureResult:
    """Stands in for measure_built_gpu: the binary b"fault" poisons the context."""
    if binary == b"fault":
        return MeasureResult.error(CRASHED, "CUDA context poisoned: illegal address", build_s)
    return MeasureResult((1e-3, 1e-3), build_s=build_s)


def test_a_poisoned_measurer_reports_crashed_then_restarts(ray_session):
    from ray import cloudpickle

    from actors.gpu_measure import GpuMeasurerActor
    import tests.actors.test_gpu_measure as me

    cloudpickle.register_pickle_by_value(me)  # workers need not import the tests package
    ray = ray_session
    actor = GpuMeasurerActor.options(num_gpus=0).remote(MeasureOptions(), fake_measure)
    c = CASES["dense_bias_gelu"]
    cfg = cuda_space_for(c).sample(random.Random(0)).to_json()
    first = ray.get(actor.ready.remote())
    crashed = MeasureResult.from_json(ray.get(actor.measure.remote(c.to_json(), cfg,
                                                                    b"fault", 0.5)))
    assert crashed.error_kind == CRASHED and crashed.build_s == 0.5
    after = MeasureResult.from_json(ray.get(actor.measure.remote(c.to_json(), cfg, b"ok", 0.1),
                                            timeout=60))
    assert after.ok and after.build_s == 0.1  # measured by the restarted process
    assert ray.get(actor.ready.remote(), timeout=60) != first
    ray.kill(actor, no_restart=True)


@pytest.mark.skipif(nvrtc_unavailable() is not None, reason="NVRTC unavailable")
def test_cuda_builder_actor_returns_bytes_or_the_error(ray_session):
    from actors.cuda_builder import CudaBuilderActor

    ray = ray_session
    builder = CudaBuilderActor.remote()
    c = CASES["softmax_last"]
    cfg = cuda_space_for(c).sample(random.Random(0))
    good: CudaBuildResult = ray.get(builder.build.remote(c.to_json(), cfg.to_json(), "sm_90"))
    assert good.error is None and good.cubin[:4] == b"\x7fELF" and good.registers > 0
    bad = ray.get(builder.build.remote(c.to_json(), Config.of(threads=3, vec=1).to_json(),
                                       "sm_90"))
    assert bad.cubin is None and "threads=3" in bad.error
    ray.kill(builder, no_restart=True)
