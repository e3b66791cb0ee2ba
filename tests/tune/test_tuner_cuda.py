"""The tuner on target cuda, anywhere: the search pool with the sm_90 space and features,
every proposed config rendered and compiled by NVRTC for sm_90, then timed by the fake
measurer (analytic timings) since no GPU runs it here."""
import collections

import pytest

import raytune_kernels as rk
from raytune_kernels.cuda.build import build_cuda, nvrtc_unavailable
from raytune_kernels.cuda.render import cuda_unsupported_reason
from raytune_kernels.cuda.gpu import gpu_info
from tests.support.fake import FakeMeasurer
from raytune_kernels.measure import BUILD_ERROR, MeasureResult
from raytune_kernels.tune.records import RecordWriter, load_records
from raytune_kernels.tune.search import SearchOptions
from raytune_kernels.tune.tuner import LocalSearchPool, TuneOptions, Tuner
from raytune_kernels.backend import cuda_backend

pytestmark = pytest.mark.skipif(nvrtc_unavailable() is not None,
                                reason=f"NVRTC unavailable: {nvrtc_unavailable()}")

ARCH, TARGET = "sm_90", "cuda -arch=sm_90"


@pytest.fixture(scope="module")
def cuda_tasks(zoo_models):
    """One task of each kind of kernel: a tiled GEMM (ResNet-18's fc layer), a sliding
    window (its max pool) and a row reduction (BERT's softmax)."""
    resnet = rk.extract_tasks(*zoo_models["resnet18"], target="cuda")
    bert = rk.extract_tasks(*zoo_models["bert_layer"], target="cuda")
    picks = [next(t for t in resnet if t.compute.op == "dense"),
             next(t for t in resnet if t.compute.op == "max_pool2d"),
             next(t for t in bert if t.compute.op == "softmax")]
    assert all(cuda_unsupported_reason(t.compute) is None for t in picks)
    return picks


class NvrtcThenFake:
    """Measures by compiling each candidate for `arch` with NVRTC (a failed build is a
    build_error, as in the pipeline), then timing it analytically."""

    def __init__(self, arch: str = ARCH):
        self.arch, self.fake, self.builds = arch, FakeMeasurer(), []

    def __call__(self, items):
        out = []
        for task, cfg in items:
            built = build_cuda(task.compute, cfg, self.arch)
            self.builds.append(built)
            out.append(self.fake.measure(task, cfg) if built.error is None else
                       MeasureResult.error(BUILD_ERROR, built.error, built.seconds))
        return out


def test_cuda_tuning_compiles_every_proposal_and_learns(cuda_tasks, tmp_path):
    path, trials = str(tmp_path / "cuda.jsonl"), 24
    measure = NvrtcThenFake()
    pool = LocalSearchPool(cuda_tasks, cuda_backend(gpu_info(ARCH)), seed=0,
                           opts=SearchOptions(population=32, generations=2))
    with RecordWriter(path) as writer:
        tuner = Tuner(cuda_tasks, TARGET, "fake H100", measure, pool, writer,
                      opts=TuneOptions(trials=trials, batch=4))
        result = tuner.run()
    assert [b.error for b in measure.builds if b.error] == []
    assert len(measure.builds) == trials and all(b.cubin[:4] == b"\x7fELF"
                                                 for b in measure.builds)
    records = load_records(path).records
    assert len(records) == trials and all(r.ok for r in records)
    assert {r.target for r in records} == {TARGET} and {r.device for r in records} == {
        "fake H100"}
    seen = collections.Counter((r.task_key, r.config_key()) for r in records)
    assert max(seen.values()) == 1  # the search never proposed a config twice
    assert set(result.best) == {t.key for t in cuda_tasks}
    assert pool.model.trained  # learned from the cuda features of the records


def test_a_resumed_cuda_run_skips_other_targets_records(cuda_tasks, tmp_path):
    """Records of another arch say nothing about this one: they are not resumed."""
    path = str(tmp_path / "cuda.jsonl")
    task = cuda_tasks[2]
    with RecordWriter(path) as writer:
        Tuner([task], "cuda -arch=sm_80", "fake A100", NvrtcThenFake("sm_80"),
              LocalSearchPool([task], cuda_backend(gpu_info("sm_80"))), writer,
              opts=TuneOptions(trials=4, batch=4)).run()
    measure = NvrtcThenFake()
    pool = LocalSearchPool([task], cuda_backend(gpu_info(ARCH)))
    tuner = Tuner([task], TARGET, "fake H100", measure, pool, None,
                  load_records(path).records, TuneOptions(trials=4, batch=4))
    tuner.run()
    assert len(measure.builds) == 4 and {r.target for r in tuner.records} == {TARGET}


def test_tuning_in_tf32_searches_both_kernel_families_and_records_the_precision(cuda_tasks,
                                                                                 tmp_path):
    """The dense of cuda_tasks gets FFMA and tensor-core candidates (each built by NVRTC);
    every record names the precision in its target, so an fp32 run never resumes them."""
    path, target = str(tmp_path / "tf32.jsonl"), f"{TARGET} -precision=tf32"
    measure = NvrtcThenFake()
    pool = LocalSearchPool(cuda_tasks, cuda_backend(gpu_info(ARCH), "tf32"), seed=0,
                           opts=SearchOptions(population=48, generations=2))
    with RecordWriter(path) as writer:
        Tuner(cuda_tasks, target, "fake H100", measure, pool, writer,
              opts=TuneOptions(trials=40, batch=8)).run()
    assert [b.error for b in measure.builds if b.error] == []
    records = load_records(path).records
    assert {r.target for r in records} == {"cuda -arch=sm_90 -precision=tf32"}
    dense = [r for r in records if r.task_key == cuda_tasks[0].key]
    kinds = {r.config.get("kernel") for r in dense}
    assert kinds == {"ffma", "mma"}, kinds
    assert all(r.config["precision"] == "tf32" for r in dense)
    assert all("kernel" not in r.config for r in records if r not in dense)  # windows, rows
