"""PyTorch timed on the GPU: what runs anywhere (what a machine lacks, in words; TF32 off
and restored; the timing protocol on a fake cupy clock; copies of a model and its inputs),
and on a machine with a GPU, a real matmul timed by CUDA events."""
import types

import numpy as np
import pytest
import torch

from raytune_kernels.cuda import device
from raytune_kernels.cuda import torch_timing as torch_gpu
from raytune_kernels.errors import RaytuneError
from raytune_kernels.timing import TimingOptions

HAS_GPU = torch_gpu.gpu_problem() is None


@pytest.fixture
def machine(monkeypatch):
    """Set what torch and cupy see: machine(torch_cuda=..., torch_gpu=..., cupy=..., gpus=...)."""
    def set_(torch_cuda="12.4", torch_gpu_=True, cupy=True, gpus=1):
        monkeypatch.setattr(torch.version, "cuda", torch_cuda)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: torch_gpu_)
        monkeypatch.setattr(device, "has_cupy", lambda: cupy)
        monkeypatch.setattr(device, "gpu_count", lambda: gpus)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return set_


@pytest.fixture
def tf32_on():
    """TF32 allowed and cudnn.benchmark off, as a user may have left them."""
    b = torch.backends
    old = b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark
    b.cuda.matmul.allow_tf32 = b.cudnn.allow_tf32 = True
    b.cudnn.benchmark = False
    yield
    b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark = old


def test_gpu_problem_names_what_is_missing(machine, monkeypatch):
    machine(torch_cuda=None, gpus=0)
    assert torch_gpu.gpu_problem() == (f"torch {torch.__version__} is a build without CUDA; "
                                       "cupy sees no GPU")
    machine(torch_gpu_=False, cupy=False, gpus=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    problem = torch_gpu.gpu_problem()
    assert "torch (CUDA 12.4) sees no GPU" in problem and "cupy is not installed" in problem
    assert "CUDA_VISIBLE_DEVICES=''" in problem
    machine()
    assert torch_gpu.gpu_problem() is None
    machine(gpus=0)  # torch sees one, cupy (which clocks it) does not
    assert torch_gpu.gpu_problem() == "cupy sees no GPU"


def test_require_gpu_says_who_needs_it_and_why_not(machine):
    machine(torch_cuda=None, gpus=0)
    with pytest.raises(torch_gpu.NoGpuError) as info:
        torch_gpu.require_gpu("target 'cuda'")
    assert isinstance(info.value, RaytuneError)  # the CLI reports these as one line
    assert str(info.value).startswith("target 'cuda' needs a CUDA GPU, and no CUDA GPU is "
                                      "visible here (torch ")


def test_torch_gpu_mode_turns_tf32_off_then_restores(tf32_on):
    b = torch.backends
    with torch_gpu.torch_gpu_mode():
        assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == \
            (False, False, True)
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == \
        (True, True, False)
    with pytest.raises(KeyError), torch_gpu.torch_gpu_mode(benchmark=False):
        assert b.cudnn.benchmark is False
        raise KeyError  # restored on the way out of an error too
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32) == (True, True)


class FakeCupy:
    """cupy's events and L2 flusher on a virtual clock that only `tick` advances."""

    float32 = np.float32
    zeros = staticmethod(np.zeros)

    def __init__(self):
        self.now, self.flushes = 0.0, 0
        fake = self

        class Event:
            def record(self):
                self.t = fake.now

            def synchronize(self):
                pass

        class Device:
            attributes = {"L2CacheSize": 1 << 20}

        self.cuda = types.SimpleNamespace(
            Event=Event, Device=Device, get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)

    def add(self, buf, value, out):
        self.flushes += 1
        np.add(buf, value, out=out)


def test_time_torch_gpu_follows_the_protocol_with_tf32_off(tf32_on):
    cp, calls = FakeCupy(), []

    def fn():  # 50 us per call on the fake clock; notes the state torch ran in
        b = torch.backends
        calls.append((b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark,
                      torch.is_grad_enabled()))
        cp.now += 50e-6

    opts = TimingOptions(warmup=4, min_repeat_ms=1.0, repeats=5)
    times = torch_gpu.time_torch_gpu(fn, opts, flush_cache=True, cp=cp)
    assert times == pytest.approx([50e-6] * 5)
    assert cp.flushes == 5  # the L2 flushed before each repeat
    # every call: TF32 off, cuDNN picking its best algorithm, no autograd
    assert set(calls) == {(False, False, True, False)}
    assert torch.backends.cuda.matmul.allow_tf32  # the caller's setting back afterwards
    per_repeat = (len(calls) - 4) // 5
    assert per_repeat >= 20  # number grown until a repeat lasts min_repeat_ms (1 ms)
    cp.flushes = 0
    torch_gpu.time_torch_gpu(fn, opts, cp=cp)
    assert cp.flushes == 0  # no flush unless asked


def test_on_gpu_copies_model_and_inputs_leaving_the_callers_alone():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten())
    x, v = torch.randn(1, 3, 8, 8), torch.randn(5)
    moved, (mx, mv) = torch_gpu.on_gpu(model, (x, v), channels_last=True, device="cpu")
    assert moved is not model and not moved.training and model.training
    assert moved[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert mx.is_contiguous(memory_format=torch.channels_last) and torch.equal(mx, x)
    assert torch.equal(mv, v)
    plain, (px, _) = torch_gpu.on_gpu(model, (x, v), device="cpu")
    assert not plain[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert px.is_contiguous()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason=f"needs a CUDA GPU: {torch_gpu.gpu_problem()}")
def test_a_matmul_on_the_gpu_is_timed_by_cuda_events():
    a = torch.randn(2048, 2048, device="cuda")
    seen = []

    def fn():
        seen.append(torch.backends.cuda.matmul.allow_tf32)
        return a @ a

    times = torch_gpu.time_torch_gpu(fn, TimingOptions(3, 10, 5), flush_cache=True)
    assert len(times) == 5 and all(t > 0 for t in times) and not any(seen)
    # 2 * 2048^3 flops in fp32 cannot beat 200 TFLOP/s (no GPU does without TF32)
    assert min(times) > 2 * 2048 ** 3 / 200e12
    assert torch_gpu.require_gpu("this test") == torch_gpu.gpu_name()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason=f"needs a CUDA GPU: {torch_gpu.gpu_problem()}")
def test_a_layout_change_inside_a_network_is_timed_replayed_from_a_graph():
    """A compiled network's transform steps run inside its graph: timed that way
    (graphed) a small permute-and-copy is faster than torch launching it from Python,
    which the eager baselines keep."""
    x = torch.randn(1, 64, 28, 28, device="cuda")

    def fn():
        return x.permute(0, 2, 3, 1).contiguous()
    opts = TimingOptions(3, 5, 5)
    eager = np.median(torch_gpu.time_torch_gpu(fn, opts, flush_cache=True))
    graphed = np.median(torch_gpu.time_torch_gpu(fn, opts, flush_cache=True, graphed=True))
    assert graphed < eager, (graphed, eager)


class _FakeStream:
    cuda_stream = 0

    def wait_stream(self, other) -> None:
        pass


class _FakeGraph:
    def replay(self) -> None:
        pass


def test_a_graphed_callable_keeps_what_its_graph_reads_alive(monkeypatch):
    """A captured graph reads the model's weights and the inputs at fixed addresses: the
    replaying callable must hold them. Dropped, their memory goes back to the allocator,
    and the next capture's empty_cache unmaps it under the graph (an illegal address)."""
    import contextlib
    import gc
    import weakref

    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())

    class Weights:
        pass

    weights = Weights()
    alive = weakref.ref(weights)
    replay = torch_gpu.cuda_graphed(lambda w=weights: "out", warmup=1)
    del weights
    gc.collect()
    assert alive() is not None
    assert replay() == "out"
    del replay
    gc.collect()
    assert alive() is None


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason=f"needs a CUDA GPU: {torch_gpu.gpu_problem()}")
def test_a_graph_variant_replays_after_later_captures_empty_the_cache():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU()).eval()
    x = torch.randn(2, 3, 32, 32)
    first = torch_gpu.GpuVariant("graph", "fp32")
    with torch.no_grad(), torch_gpu.precision_mode("fp32"):
        fn = torch_gpu.build_variant(model, (x,), first)
        torch_gpu.build_variant(model, (x,), torch_gpu.GpuVariant("graph", "fp16"))
        torch.cuda.empty_cache()
        out = fn().cpu()
        torch.cuda.synchronize()
        want = model(x)
    assert torch.allclose(out, want, atol=1e-4)
