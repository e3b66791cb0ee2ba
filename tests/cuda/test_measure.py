"""GPU measurement: what runs anywhere (no-GPU errors, fault classification, the timing
protocol on a fake clock), and, on a machine with a GPU, every ResNet-18 task checked
against the torch reference, wrong kernels caught, faults isolated in a subprocess."""
import json
import random
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest
import torch

import raytune_kernels as rk
from raytune_kernels import measure
from raytune_kernels.cuda import device
from raytune_kernels.cuda import measure as measure_gpu
from tests.support import cuda_emulate
from raytune_kernels.cuda.build import build_cuda, compile_cuda
from raytune_kernels.cuda.kernel import CudaBuffer, CudaKernel
from raytune_kernels.cuda.render import cuda_space_for, render_cuda
from raytune_kernels.measure import (CRASHED, MEASURE_PHASES, MeasureOptions, MeasureResult,
                                     RUNTIME_ERROR, WRONG_OUTPUT, rotating_copies)
from raytune_kernels.timing import TimingOptions, time_runs

QUICK = MeasureOptions(warmup=2, min_repeat_ms=2, repeats=3, flush_cache=True)


def _has_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.fixture(scope="module")
def gpu():
    """The GPU's arch; skips the test on machines without cupy or a CUDA GPU."""
    pytest.importorskip("cupy")
    if not _has_gpu():
        pytest.skip("no CUDA GPU visible to cupy")
    return device.device_arch()


@pytest.fixture(scope="module")
def resnet18_tasks(zoo_models):
    model, inputs = zoo_models["resnet18"]
    return rk.extract_tasks(model, inputs, target="cuda")


def _dense():
    model = torch.nn.Sequential(torch.nn.Linear(64, 40), torch.nn.GELU())
    return rk.extract_tasks(model.eval(), (torch.randn(8, 64),))[0].compute


def test_without_a_gpu_measurement_is_a_runtime_error(monkeypatch):
    monkeypatch.setattr(device, "gpu_count", lambda: 0)
    c = _dense()
    result = measure_gpu.measure_built_gpu(c, cuda_space_for(c).sample(random.Random(0)),
                                           b"\x7fELF", QUICK, build_s=0.25)
    assert result.error_kind == RUNTIME_ERROR and "no CUDA GPU 0" in result.error_msg
    assert result.build_s == 0.25 and MeasureResult.from_json(result.to_json()) == result


class _CudaError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


def test_context_poisoning_errors_are_told_apart():
    assert device.is_sticky(_CudaError(700, "CUDA_ERROR_ILLEGAL_ADDRESS"))
    assert device.is_sticky(_CudaError(716, "CUDA_ERROR_MISALIGNED_ADDRESS"))
    assert device.is_sticky(RuntimeError("an illegal memory access was encountered"))
    assert not device.is_sticky(_CudaError(2, "CUDA_ERROR_OUT_OF_MEMORY"))
    assert not device.is_sticky(_CudaError(701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"))


def test_time_runs_grows_number_and_flushes_before_each_repeat():
    calls, flushes = [], []

    def run(number):  # a fake clock: 0.1 ms per call
        calls.append(number)
        return number * 1e-4
    times = time_runs(run, TimingOptions(warmup=0, min_repeat_ms=5, repeats=4),
                      lambda: flushes.append(len(calls)))
    assert times == pytest.approx([1e-4] * 4)
    assert calls[-1] * 1e-4 * 1e3 >= 5 and calls[0] == 1 and len(set(calls[-4:])) == 1
    assert flushes == [len(calls) - 4, len(calls) - 3, len(calls) - 2, len(calls) - 1]


def test_graph_timer_replays_graphs_of_a_unit_and_the_rest():
    """number calls are number // unit replays of one captured graph and one graph of the
    rest: each length captured once, however many repeats ask for it, and exactly
    `number` calls run."""
    captured, ran = [], []

    def capture(n):
        captured.append(n)
        return lambda: ran.append(n)
    clock = types.SimpleNamespace(t=0.0)

    class Event:
        def record(self, stream=None):
            self.t = clock.t + 1e-6 * sum(ran)  # a fake GPU: 1 us a call

        def synchronize(self):
            pass
    cp = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Event=Event, get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3))
    run = device.graph_timer(capture, cp, unit=64)
    assert run(5) == pytest.approx(5e-6) and captured == [5]  # no unit graph for a short run
    captured.clear(), ran.clear()
    run = device.graph_timer(capture, cp, unit=64)
    assert run(1000) == pytest.approx(1000e-6) and sum(ran) == 1000
    assert sorted(captured) == [1000 % 64, 64]
    ran.clear()
    assert run(1000) == pytest.approx(1000e-6) and run(64) == pytest.approx(64e-6)
    assert run(5) == pytest.approx(5e-6) and sorted(captured) == [5, 1000 % 64, 64]
    assert ran.count(64) == 1000 // 64 + 1  # the second run(1000), then run(64)


def test_weight_copies_cover_twice_the_cache_in_whole_cycles_of_a_graph():
    """A GPU's rotating weight copies: together at least twice the L2 (or the most, 256),
    a power of two, so a graph of GRAPH_UNIT launches cycling through them, replayed back
    to back, reads every copy exactly `copies` launches after its last read."""
    l2 = 50 << 20
    for nbytes in (4, 37 << 10, 1 << 20, 2359296, 9437184, 30 << 20, 200 << 20):
        copies = device.weight_copies(nbytes, l2)
        assert copies & (copies - 1) == 0 and device.GRAPH_UNIT % copies == 0
        assert copies * nbytes >= 2 * l2 or copies == 256
        assert copies >= rotating_copies(nbytes, 2 * l2)
        seq = [i % copies for i in range(device.GRAPH_UNIT)] * 2  # two replays
        last = {}
        for i, c in enumerate(seq):
            assert c not in last or i - last[c] == copies
            last[c] = i


class _FakeCupy:
    """Just enough of cupy for measure_gpu, with the CPU emulator as the GPU: the "binary"
    is the kernel's CUDA source. An emulator failure (ASan) raises CUDA error 700 (illegal
    address). Each launch re-uses the first launch's output (the inputs never change)."""

    float32 = np.float32
    asnumpy, zeros, add = staticmethod(np.asarray), staticmethod(np.zeros), staticmethod(np.add)

    def __init__(self):
        self.launches = self.captures = self.replays = 0
        self.stream, self.weights = None, set()
        fake = self

        class Device:
            attributes = {"L2CacheSize": 1 << 20}
            compute_capability = "90"

            def __init__(self, device=0):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def synchronize(self):
                pass

        class Event:
            def record(self, stream=None):
                self.t = time.perf_counter()

            def synchronize(self):
                pass

        class Graph:  # what a stream captured, replayed launch by launch
            def __init__(self, launches):
                self.launches = launches

            def launch(self, stream=None):
                fake.replays += 1
                for launch in self.launches:
                    launch()

        class Stream:  # launches inside `with stream` after begin_capture are recorded
            def __init__(self, non_blocking=False):
                self.recorded = None

            def __enter__(self):
                fake.stream = self
                return self

            def __exit__(self, *exc):
                fake.stream = None
                return False

            def begin_capture(self, mode=None):
                self.recorded = []

            def end_capture(self):
                fake.captures += 1
                graph, self.recorded = Graph(self.recorded), None
                return graph

        self.cuda = types.SimpleNamespace(
            Device=Device, Event=Event, Stream=Stream,
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
            get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)

        class RawModule:
            def __init__(self, path):
                with open(path, "rb") as f:
                    self.source = f.read().decode()

            def get_function(self, name):
                def fn(grid, block, args, shared_mem=0):
                    run = lambda: fake.launch(self.source, name, grid, block, args)  # noqa: E731
                    capturing = fake.stream is not None and fake.stream.recorded is not None
                    fake.stream.recorded.append(run) if capturing else run()
                return fn
        self.RawModule = RawModule

    @staticmethod
    def asarray(a):
        return np.array(a, np.float32)

    def launch(self, source, name, grid, block, args):
        self.launches += 1
        self.weights.add(id(args[1]))
        if not hasattr(self, "out"):
            bufs = tuple(CudaBuffer(f"b{i}", a.size, "in") for i, a in enumerate(args))
            kernel = CudaKernel(name, source, grid, block, 0, bufs)
            try:
                self.out = cuda_emulate.emulate(kernel, list(args))
            except cuda_emulate.EmulationError as exc:
                raise _CudaError(700, f"CUDA_ERROR_ILLEGAL_ADDRESS: {exc}") from exc
        args[-1][:] = self.out


needs_cxx = pytest.mark.skipif(cuda_emulate.compiler() is None, reason="no C++ compiler")


@needs_cxx
def test_measurement_flow_on_the_emulated_device(monkeypatch):
    """measure_built_gpu end to end with the emulator standing in for cupy and the GPU:
    check before timing, warm-up, repeats, L2 flushes; wrong and faulting kernels."""
    flushes, references = [], []
    monkeypatch.setattr(measure, "_LAST_TASK", {})
    real_reference = measure_gpu.gpu_reference
    monkeypatch.setattr(measure_gpu, "gpu_reference",
                        lambda c, xs: (references.append(1), real_reference(c, xs))[1])
    real = device.l2_flusher
    monkeypatch.setattr(device, "l2_flusher",
                        lambda cp: (lambda f: lambda: (flushes.append(1), f()))(real(cp)))
    c = _dense()
    cfg = cuda_space_for(c).sample(random.Random(5))
    source = render_cuda(c, cfg).source
    opts = MeasureOptions(warmup=2, min_repeat_ms=0.5, repeats=3, flush_cache=True,
                          settle=0.0)  # a set retimed would flush again
    for binary, kind in ((source, None), (source.replace("erff(", "tanhf("), WRONG_OUTPUT),
                         (source.replace("out[o0", "out[o0 + 4096").replace(
                             "(out + o0)", "(out + o0 + 4096)"), CRASHED)):
        fake = _FakeCupy()
        monkeypatch.setattr(device, "cupy", lambda: fake)
        result = measure_gpu.measure_built_gpu(c, cfg, binary.encode(), opts, 0.5)
        assert result.error_kind == kind, result.error_msg
        if kind is None:
            assert len(result.times) == 3 and len(flushes) == 3 and fake.launches > 6
            # where its time went, by the phases a CPU measurement reports
            assert [p for p, _ in result.phases] == list(MEASURE_PHASES)
            assert sum(t for _, t in result.phases) == pytest.approx(result.run_s, rel=1e-6)
            # every timed repeat replayed a captured graph: no launch from a Python loop
            assert fake.captures >= 1 and fake.replays >= 3 + fake.captures
            assert len(fake.weights) == 1  # warm weights: the one buffer
        else:
            assert result.times == () and fake.launches == 1
    assert device.POISONED in result.error_msg and device.device_arch() == "sm_90"
    assert references == [1]  # three candidates of one task: its operands drawn once
    # cold weights: the dense's launches cycle through copies covering twice the L2
    fake = _FakeCupy()
    monkeypatch.setattr(device, "cupy", lambda: fake)
    cold = MeasureOptions(warmup=2, min_repeat_ms=0.5, repeats=3, cold_weights=True)
    assert measure_gpu.measure_built_gpu(c, cfg, source.encode(), cold).ok
    copies = device.weight_copies(c.inputs[1].numel * 4, fake.cuda.Device.attributes["L2CacheSize"])
    assert copies > 2 and len(fake.weights) == copies


def _measure(compute, cfg, arch, opts=QUICK) -> MeasureResult:
    built = build_cuda(compute, cfg, arch)
    assert built.error is None, built.error
    return measure_gpu.measure_built_gpu(compute, cfg, built.cubin, opts, built.seconds)


def test_every_resnet18_task_matches_the_reference_on_the_gpu(gpu, resnet18_tasks):
    for i, task in enumerate(resnet18_tasks):
        space, rng = cuda_space_for(task.compute), random.Random(i)
        for _ in range(3):
            cfg = space.sample(rng)
            result = _measure(task.compute, cfg, gpu)
            assert result.ok, (task.compute.describe(), cfg.to_json(), result.error_msg)
            assert len(result.times) == 3 and 0 < result.median < 0.1


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
def test_tensor_core_configs_of_resnet18_tasks_match_on_the_gpu(gpu, resnet18_tasks, precision):
    """What the emulator's model of mma.sync and cp.async cannot show: that the PTX
    operand order and fragment layouts are the hardware's. Every tensor-core GEMM task
    runs its untuned default and a sampled tensor-core config, checked against the
    float32 reference within the precision's kernel tolerance."""
    from raytune_kernels.cuda.gpu import arch_has_mma, gpu_info
    from raytune_kernels.cuda.render import default_config

    if not arch_has_mma(gpu):
        pytest.skip(f"{gpu} has no tensor cores")
    checked = 0
    for i, task in enumerate(resnet18_tasks):
        space, rng = cuda_space_for(task.compute, precision), random.Random(i)
        mma = [c for c in (space.sample(rng) for _ in range(64))
               if dict(c.knobs).get("kernel") == "mma"][:1]
        default = default_config(task.compute, precision, gpu_info(gpu).sms)
        for cfg in ([default] if dict(default.knobs).get("kernel") == "mma" else []) + mma:
            result = _measure(task.compute, cfg, gpu)
            assert result.ok, (task.compute.describe(), cfg.to_json(), result.error_msg)
            checked += 1
    assert checked >= 10  # ResNet-18's convs and its dense layer


@pytest.mark.slow
def test_sampled_configs_of_every_zoo_task_match_on_the_gpu(gpu, zoo_models):
    for name in sorted(zoo_models):
        for i, task in enumerate(rk.extract_tasks(*zoo_models[name])):
            cfg = cuda_space_for(task.compute).sample(random.Random(i))
            result = _measure(task.compute, cfg, gpu, MeasureOptions(min_repeat_ms=1,
                                                                     repeats=1))
            assert result.ok, (name, task.compute.describe(), cfg.to_json(), result.error_msg)


def test_ptx_loads_as_well_as_cubin(gpu):
    c = _dense()
    cfg = cuda_space_for(c).sample(random.Random(1))
    built = build_cuda(c, cfg, gpu)
    result = measure_gpu.measure_built_gpu(c, cfg, built.ptx, QUICK)
    assert result.ok, result.error_msg


def test_a_wrong_kernel_is_wrong_output_and_never_timed(gpu):
    c = _dense()
    cfg = cuda_space_for(c).sample(random.Random(2))
    kernel = render_cuda(c, cfg)
    wrong = compile_cuda(kernel.source.replace("erff(", "tanhf("), gpu)
    result = measure_gpu.measure_built_gpu(c, cfg, wrong.cubin, QUICK)
    assert result.error_kind == WRONG_OUTPUT and result.times == ()


def test_a_cubin_without_the_kernel_is_a_runtime_error(gpu):
    c = _dense()
    cfg = cuda_space_for(c).sample(random.Random(3))
    other = compile_cuda('extern "C" __global__ void not_it(float* o) { o[0] = 1.0f; }', gpu)
    result = measure_gpu.measure_built_gpu(c, cfg, other.cubin, QUICK)
    assert result.error_kind == RUNTIME_ERROR


def test_l2_is_flushed_before_each_repeat(gpu, monkeypatch):
    flushes, references = [], []
    monkeypatch.setattr(measure, "_LAST_TASK", {})
    real_reference = measure_gpu.gpu_reference
    monkeypatch.setattr(measure_gpu, "gpu_reference",
                        lambda c, xs: (references.append(1), real_reference(c, xs))[1])
    real = device.l2_flusher

    def counting(cp):
        flush = real(cp)
        return lambda: (flushes.append(1), flush())
    monkeypatch.setattr(device, "l2_flusher", counting)
    c = _dense()
    result = _measure(c, cuda_space_for(c).sample(random.Random(4)), gpu)
    # an L2 flush before every repeat of every set timed (a disturbed set is timed again)
    assert result.ok and len(flushes) in (QUICK.repeats * n for n in (1, 2, 3))


def test_a_short_kernel_is_timed_as_a_graph_replays_it(gpu):
    """A small dense's kernel takes far less than a launch from Python: replayed from a
    graph, as a network runs it, it times faster than a Python loop can launch it, and the
    replays compute what one launch does."""
    from raytune_kernels.cuda.render import cuda_pack, cuda_unpack, default_config
    from raytune_kernels.frontend.reference import reference
    from raytune_kernels.measure import random_operands
    from raytune_kernels.timing import median
    c = _dense()
    cfg = default_config(c)
    kernel, built = render_cuda(c, cfg), build_cuda(c, cfg, gpu)
    ops = random_operands(c)
    launch = device.Launch(kernel, device.LoadedCudaKernel(built.cubin, kernel.name),
                           cuda_pack(c, ops, cfg))
    launch()
    cp = device.cupy()
    opts = TimingOptions(warmup=0, min_repeat_ms=5, repeats=5)
    looped = median(time_runs(device.event_timer(launch, cp), opts))
    graphed = median(time_runs(device.graph_timer(device.launch_graph(launch, cp), cp), opts))
    assert graphed < looped, (graphed, looped)
    with torch.no_grad():
        want = reference(c, *ops)
    assert torch.allclose(cuda_unpack(c, launch.output(), cfg), want, rtol=1e-4, atol=1e-4)


def test_an_illegal_address_is_crashed_and_poisons_only_its_process(gpu):
    """Run in a subprocess: the fault leaves that process's CUDA context unusable."""
    code = textwrap.dedent(f"""
        import json, random, torch
        import raytune_kernels as rk
        from raytune_kernels.cuda import measure as measure_gpu
        from raytune_kernels.cuda.build import compile_cuda
        from raytune_kernels.cuda.render import cuda_space_for, render_cuda
        from raytune_kernels.measure import MeasureOptions
        model = torch.nn.Sequential(torch.nn.Linear(64, 40), torch.nn.GELU())
        c = rk.extract_tasks(model.eval(), (torch.randn(8, 64),))[0].compute
        cfg = cuda_space_for(c).sample(random.Random(0))
        src = render_cuda(c, cfg).source.replace("out[o0] =", "out[o0 + (1 << 29)] =")
        src = src.replace("(out + o0)", "(out + o0 + (1 << 29))")
        built = compile_cuda(src, {gpu!r})
        r = measure_gpu.measure_built_gpu(c, cfg, built.cubin, MeasureOptions())
        print(json.dumps(r.to_json()))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    result = MeasureResult.from_json(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert result.error_kind == CRASHED and device.POISONED in result.error_msg
    c = _dense()  # this process's context is untouched
    assert _measure(c, cuda_space_for(c).sample(random.Random(0)), gpu).ok
