"""tune_network on target cuda: without a GPU in the Ray cluster it fails before any work
(here, and through the command line); the search and cost-model actors tune cuda tasks
against NVRTC builds timed by the fake; on a machine with a GPU, a tiny model is tuned end
to end through the real GPU measurer and NVRTC builders (skipped elsewhere)."""
import collections
import textwrap

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cli import main
from actors.driver import TuneError
from raytune_kernels.cuda.build import nvrtc_unavailable
from raytune_kernels.cuda.gpu import gpu_info
from raytune_kernels.tune.records import load_records
from raytune_kernels.tune.search import SearchOptions
from raytune_kernels.tune.tuner import TuneOptions, Tuner
from raytune_kernels.backend import cuda_backend

from tests.support.fake import FakeMeasurer
from tests.tune.test_tuner_cuda import NvrtcThenFake
from tests.actors.test_tune import Tiny


class TinyGpu(torch.nn.Module):
    """Tiny, with every task a CUDA kernel (Tiny's 16-wide fc has no GEMM tiling)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 8 * 8, 64)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _no_gpu(ray) -> None:
    if ray.cluster_resources().get("GPU", 0):
        pytest.skip("this Ray cluster has a GPU")


@pytest.mark.parametrize("entry", ["tune_network", "tune_tasks"])
def test_cuda_without_a_gpu_fails_before_any_work(entry, ray_session, tmp_path):
    _no_gpu(ray_session)
    path = tmp_path / "r.jsonl"
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    what = (model, (x,)) if entry == "tune_network" else (rk.extract_tasks(model, (x,)),)
    with pytest.raises(TuneError, match="'cuda -arch=sm_90' needs a GPU .* has none"):
        getattr(rk, entry)(*what, target="cuda -arch=sm_90", records=str(path), trials=4,
                           verbose=False)
    assert not path.exists()


def test_the_command_line_names_the_missing_gpu(ray_session, tmp_path, capsys):
    _no_gpu(ray_session)
    factory = tmp_path / "tiny.py"
    factory.write_text(textwrap.dedent("""
        import torch
        def make():
            return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), (torch.randn(2, 8),)
    """))
    records = tmp_path / "r.jsonl"
    assert main(["tune", f"{factory}:make", "--target", "cuda", "--trials", "4",
                 "--records", str(records)]) == 2
    assert "target 'cuda' needs a GPU" in capsys.readouterr().err
    assert not records.exists()


def test_cpu_options_are_refused_for_cuda(tmp_path):
    model, x = Tiny().eval(), torch.randn(1, 16, 8, 8)
    for kwargs in ({"threads": 2}, {"num_measurers": 2}):
        with pytest.raises(TuneError, match="CPU options"):
            rk.tune_network(model, (x,), target="cuda", records=str(tmp_path / "r.jsonl"),
                            **kwargs)
    assert not (tmp_path / "r.jsonl").exists()


def test_tasks_without_a_cuda_kernel_are_left_out_with_a_warning():
    from actors.driver import _tunable
    from raytune_kernels.task import Compute, Task, TensorSpec

    tasks = rk.extract_tasks(Tiny().eval(), (torch.randn(1, 16, 8, 8),), target="cuda")
    half = TensorSpec((4, 32), "float16")  # the CUDA kernels are float32 only
    odd = Compute("softmax", (half,), half, (("dim", 1),))
    tasks.append(Task(odd.key(), odd, 1, ("attn",)))
    with pytest.warns(UserWarning, match="not tuned for cuda .*softmax 4x32.*float16"):
        kept, skipped = _tunable(tasks, rk.parse_target("cuda"))
    assert [t.compute.op for t in kept] == ["conv2d", "dense"]
    assert [t.compute.op for t in skipped] == ["softmax"]
    assert len(_tunable(tasks[:2], rk.parse_target("llvm"))[0]) == 2  # both lower for the CPU


@pytest.mark.skipif(nvrtc_unavailable() is not None, reason="NVRTC unavailable")
def test_search_and_cost_model_actors_tune_cuda_tasks(ray_session):
    """The SearchPool the scheduler actor uses, on the sm_90 space and features."""
    from actors.tuning_actors import RaySearchPool

    tasks = rk.extract_tasks(TinyGpu().eval(), (torch.randn(1, 16, 8, 8),), target="cuda")
    measure = NvrtcThenFake()
    pool = RaySearchPool(tasks, cuda_backend(gpu_info("sm_90")), 0, SearchOptions(population=32,
                                                                     generations=2))
    tuner = Tuner(tasks, "cuda -arch=sm_90", "fake H100", measure, pool,
                  opts=TuneOptions(trials=20, batch=4))
    result = tuner.run()
    assert [b.error for b in measure.builds if b.error] == [] and len(measure.builds) == 20
    seen = collections.Counter((r.task_key, r.config_key()) for r in tuner.records)
    assert max(seen.values()) == 1 and set(result.best) == {t.key for t in tasks}
    assert ray_session.get(pool.model.booster.remote()) is not None  # a trained booster
    for actor in pool.actors + [pool.model]:
        ray_session.kill(actor)


def test_spread_search_actors_propose_the_rounds_of_a_stream_together(ray_session, zoo_models):
    """Tuner.stream over two search actors (placed by SPREAD) and the cost model actor:
    each round's configs come from its task's actor, none twice, the booster shared."""
    from actors.tuning_actors import RaySearchPool

    model, inputs = zoo_models["resnet18"]
    backend = cuda_backend(gpu_info("sm_90"))
    tasks = [t for t in rk.extract_tasks(model, inputs)
             if backend.unsupported(t.compute) is None][:4]
    pool = RaySearchPool(tasks, backend, 0, SearchOptions(), num_search=2, spread=True)
    owners = {t.key: pool.owner[t.key] for t in tasks}
    assert len({id(a) for a in owners.values()}) == 2
    fake, flight, asked = FakeMeasurer(), {}, []
    many = pool.propose_many
    pool.propose_many = lambda asks: asked.append(len(asks)) or many(asks)

    def launch(items):
        flight[len(flight)] = [fake.measure(t, c) for t, c in items]
        return len(flight) - 1

    def wait(handles):
        return [(h, flight[h]) for h in handles[:2]]

    tuner = Tuner(tasks, "cuda -arch=sm_90", "fake H100", None, pool,
                  opts=TuneOptions(trials=48, batch=4))
    result = tuner.stream(launch, wait, depth=4)
    seen = collections.Counter((r.task_key, r.config_key()) for r in tuner.records)
    assert result.trials == 48 and max(seen.values()) == 1 and asked[0] == 4
    assert ray_session.get(pool.model.booster.remote()) is not None
    for actor in pool.actors + [pool.model]:
        ray_session.kill(actor)


def test_a_search_actor_lost_mid_run_is_replaced_and_told_what_its_tasks_measured(
        ray_session, zoo_models):
    """A search actor killed between rounds (as its node leaving would): the pool starts
    another, replays its tasks' measurements into it, and no config is measured twice."""
    from actors.tuning_actors import RaySearchPool

    model, inputs = zoo_models["resnet18"]
    backend = cuda_backend(gpu_info("sm_90"))
    tasks = [t for t in rk.extract_tasks(model, inputs)
             if backend.unsupported(t.compute) is None][:2]
    pool = RaySearchPool(tasks, backend, 0, SearchOptions(), num_search=2, spread=True)
    fake, flight = FakeMeasurer(), {}

    def launch(items):
        if len(flight) == 4:
            ray_session.kill(pool.actors[0])
        flight[len(flight)] = [fake.measure(t, c) for t, c in items]
        return len(flight) - 1

    tuner = Tuner(tasks, "cuda -arch=sm_90", "fake H100", None, pool,
                  opts=TuneOptions(trials=48, batch=4))
    result = tuner.stream(launch, lambda handles: [(h, flight[h]) for h in handles[:1]], 2)
    seen = collections.Counter((r.task_key, r.config_key()) for r in tuner.records)
    assert result.trials == 48 and max(seen.values()) == 1 and pool.restarts == 1
    assert ray_session.get(pool.actors[0].measured.remote(tasks[0].key)) == \
        len({r.config_key() for r in tuner.records if r.task_key == tasks[0].key})
    for actor in pool.actors + [pool.model]:
        ray_session.kill(actor)


@pytest.mark.gpu
def test_tune_a_tiny_model_on_the_gpu(ray_session, tmp_path):
    pytest.importorskip("cupy")
    from raytune_kernels.cuda import device

    if not ray_session.cluster_resources().get("GPU", 0) or device.gpu_count() == 0:
        pytest.skip("no CUDA GPU in this Ray cluster")
    model, x = TinyGpu().eval(), torch.randn(1, 16, 8, 8)
    path = str(tmp_path / "tiny_cuda.jsonl")
    result = rk.tune_network(model, (x,), target="cuda", trials=8, records=path, batch=4,
                             verbose=False)
    tasks = rk.extract_tasks(model, (x,), target="cuda")
    records = load_records(path).records
    assert len(records) == 8 and result.trials == 8
    assert {r.target for r in records} == {f"cuda -arch={device.device_arch()}"}
    assert {r.device for r in records} == {device.device_name()}
    assert set(result.best) == {t.key for t in tasks}  # every task has a valid kernel
    expected = sum(t.weight * result.best[t.key].median for t in tasks)
    assert result.estimated_latency_s == pytest.approx(expected)
    # resumed with the trials already recorded: the GPU named by a task, no actor started
    again = rk.tune_network(model, (x,), target="cuda", trials=8, records=path, batch=4,
                            verbose=False)
    assert again.best == result.best and again.setup["measurers"] == 0
    assert len(load_records(path).records) == 8


def test_a_setup_problem_in_the_scheduler_actor_reaches_the_driver_as_itself(ray_session):
    """What the scheduler actor finds while setting up (cubins that will not load on the
    measuring GPU) is raised by tune_network as that error, not as Ray's wrapper."""
    from raytune_kernels.cuda.gpu import ArchMismatchError, check_measurable
    from actors.driver import _initial

    @ray_session.remote(num_cpus=0)
    class Refuses:
        def initial(self):
            check_measurable("sm_80", ["sm_90"])

    actor = Refuses.remote()
    with pytest.raises(ArchMismatchError, match="do not load") as info:
        _initial(ray_session, actor)
    assert type(info.value) is ArchMismatchError
    ray_session.kill(actor)
