"""PyTorch on a CUDA GPU, timed the way our GPU records are timed (bench/kernels.py,
bench/network.py and `raytune-kernels compile --target cuda` compare against it).

- TF32 off (cuBLAS and cuDNN would otherwise round float32 inputs to TF32 in matmuls and
  convolutions; our kernels are true float32) and cudnn.benchmark on (cuDNN picks its
  fastest algorithm per shape: torch at its best), both only inside `torch_gpu_mode()`;
  `precision_mode(p)` is the same with TF32 on where p is "tf32", so each precision of
  ours (raytune_kernels/precision.py) meets PyTorch in the same precision.
- The timing protocol of cuda/measure.py: warm-up, CUDA events (cuda/device.event_timer)
  around `number` calls grown until one repeat lasts min_repeat_ms, several repeats, and
  with flush_cache the L2 flushed before each repeat (cuda/device.l2_flusher).

The events are recorded on cupy's current stream and torch launches on its own current
stream; both are the legacy default stream unless someone changes them, so the events
bracket torch's kernels (compile/cuda_network.CupyDevice relies on the same). Nothing here touches
CUDA at import: the module imports on machines without a GPU, cupy or torch CUDA.

The baselines a GPU benchmark meets (build_variants): eager, eager captured in one CUDA
graph, torch.compile and its mode="reduce-overhead", each in fp32 (TF32 off), tf32, fp16
and bf16, each built alone so that one that fails is reported and left out.
"""
from __future__ import annotations

import contextlib
import copy
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from raytune_kernels.errors import RaytuneError
from raytune_kernels.cuda import device
from raytune_kernels.cuda.device import torch_gpu_mode
from raytune_kernels.precision import DEFAULT, PRECISIONS
from raytune_kernels.timing import TimingOptions, time_runs

NO_GPU = "no CUDA GPU is visible"
# the dtype PyTorch holds a model in at each precision (tf32 is float32 in memory)
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16}


class NoGpuError(RaytuneError):
    """A GPU path was asked for on a machine where torch or cupy sees no CUDA GPU."""


def gpu_problem() -> str | None:
    """None when both torch and cupy see a CUDA GPU (timing needs both: torch runs the
    model, cupy's events time it); otherwise what is missing, in words."""
    why = []
    if torch.version.cuda is None:
        why.append(f"torch {torch.__version__} is a build without CUDA")
    elif not torch.cuda.is_available():
        why.append(f"torch (CUDA {torch.version.cuda}) sees no GPU")
    if not device.has_cupy():
        why.append("cupy is not installed (pip install -e '.[cuda]')")
    elif device.gpu_count() == 0:
        why.append("cupy sees no GPU")
    if not why:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        why.append(f"CUDA_VISIBLE_DEVICES={visible!r}")
    return "; ".join(why)


def require_gpu(what: str) -> str:
    """The name of the GPU torch will use, or NoGpuError saying that `what` needs one."""
    problem = gpu_problem()
    if problem is not None:
        raise NoGpuError(f"{what} needs a CUDA GPU, and {NO_GPU} here ({problem})")
    return gpu_name()


def gpu_name() -> str:
    """The product name of torch's current CUDA device, as the CUDA driver reports it."""
    return torch.cuda.get_device_name(torch.cuda.current_device())


@contextlib.contextmanager
def precision_mode(precision: str = DEFAULT):
    """torch_gpu_mode() (TF32 off, cudnn.benchmark on), with TF32 on in cuBLAS and cuDNN
    where `precision` is "tf32" (as a user turns it on); the old settings come back on
    exit. A CUDA graph or torch.compile built in one mode must also run in it: cuDNN's
    algorithm is fixed at capture, and dynamo guards on the TF32 flag."""
    b = torch.backends
    with torch_gpu_mode():
        b.cuda.matmul.allow_tf32 = b.cudnn.allow_tf32 = precision == "tf32"
        yield


def time_torch_gpu(fn: Callable[[], object], opts: TimingOptions,
                   flush_cache: bool = False, cp=None, precision: str = DEFAULT,
                   graphed: bool = False) -> list[float]:
    """Seconds per call of `fn` (torch work on the GPU), one per repeat: inside
    precision_mode(precision) and no_grad, `opts.warmup` calls (cuDNN's autotuning
    happens there), then cuda/measure.py's protocol by CUDA events, the L2 flushed before
    each repeat with `flush_cache`. Called from Python one after another as PyTorch runs
    them eagerly; with `graphed`, replayed from one CUDA graph, as the torch steps inside a
    compiled network run (graphed_capture). `cp` is cupy (tests pass a fake)."""
    cp = cp if cp is not None else device.cupy()
    with torch.no_grad(), precision_mode(precision):
        for _ in range(opts.warmup):
            fn()
        flush = device.l2_flusher(cp) if flush_cache else None
        timer = device.graph_timer(graphed_capture(fn), cp) if graphed else \
            device.event_timer(fn, cp)
        return time_runs(timer, opts, flush)


def graphed_capture(fn: Callable[[], object]) -> Callable[[int], Callable[[], object]]:
    """capture(number) for device.graph_timer: `number` calls of `fn`'s torch GPU work in
    one CUDA graph (cuda_graphed)."""
    def capture(number: int) -> Callable[[], object]:
        def calls() -> None:
            for _ in range(number):
                fn()
        return cuda_graphed(calls, warmup=1)
    return capture


def on_gpu(model: torch.nn.Module, inputs: Sequence[torch.Tensor],
           channels_last: bool = False, device: str = "cuda",
           dtype: torch.dtype = torch.float32
           ) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A copy of `model` in eval mode and copies of `inputs` on `device` (the caller's
    model stays where it is), optionally in channels_last (4-D tensors only). With a
    `dtype` other than float32, the model's floating parameters and buffers and the
    floating inputs are cast to it; integer inputs (token ids) stay as they are."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    moved = copy.deepcopy(model).eval().to(device)
    if dtype != torch.float32:
        moved = moved.to(dtype)
    if channels_last:
        moved = moved.to(memory_format=fmt)
    return moved, tuple(_moved(x, device, dtype, fmt) for x in inputs)


def _moved(x: torch.Tensor, device: str, dtype: torch.dtype, fmt) -> torch.Tensor:
    x = x.to(device)
    if x.is_floating_point() and dtype != torch.float32:
        x = x.to(dtype)
    return x.contiguous(memory_format=fmt) if x.dim() == 4 else x


def cuda_graphed(fn: Callable[[], object], warmup: int = 3) -> Callable[[], object]:
    """`fn`'s GPU work captured in one CUDA graph, as PyTorch's docs do it (warm-up on a
    side stream, so that lazy initialisation and cuDNN's autotuning stay out of the
    capture): a zero-argument callable that replays it and returns what `fn` returned at
    capture, the graph's static outputs, which each replay rewrites. `fn` must read only
    tensors that stay in place (static inputs). Build and run it in the same
    precision_mode."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay() -> object:
        graph.replay()
        return out
    # the graph reads fn's model and inputs at the addresses they had at capture: they
    # must live as long as replay (freed, the next capture's empty_cache unmaps them)
    replay.reads = fn
    return replay


# ------------------------------------------------------------------- the baselines to beat

HOWS = ("eager", "graph", "compile", "compile_ro")


@dataclass(frozen=True)
class GpuVariant:
    """A way users run a model in PyTorch on a GPU: `how` (eager; graph: eager captured in
    one CUDA graph; compile: torch.compile; compile_ro: its mode="reduce-overhead") in
    `precision` (fp32 with TF32 off, tf32 with it on, fp16 and bf16 with the model cast and
    images in channels_last, the layout tensor cores want)."""
    how: str
    precision: str

    @property
    def name(self) -> str:
        return f"{self.how}_{self.precision}"

    @property
    def channels_last(self) -> bool:
        return self.precision in ("fp16", "bf16")


def gpu_variants(use_compile: bool = True,
                 compile_precisions: Sequence[str] = PRECISIONS) -> list[GpuVariant]:
    """Eager and graph in every precision, and torch.compile's two modes in each of
    `compile_precisions` (none without `use_compile`: each takes a minute or more)."""
    cheap = [GpuVariant(h, p) for h in HOWS[:2] for p in PRECISIONS]
    if not use_compile:
        return cheap
    return cheap + [GpuVariant(h, p) for h in HOWS[2:] for p in PRECISIONS
                    if p in compile_precisions]


def build_variant(model: torch.nn.Module, inputs: Sequence[torch.Tensor], v: GpuVariant,
                  device: str = "cuda") -> Callable[[], object]:
    """`v` as a zero-argument callable on copies of `model` and `inputs`; build and call
    it inside no_grad and precision_mode(v.precision)."""
    m, xs = on_gpu(model, inputs, channels_last=v.channels_last, device=device,
                   dtype=DTYPES[v.precision])
    if v.how == "graph":
        return cuda_graphed(lambda: m(*xs))
    if v.how in ("compile", "compile_ro"):
        _compile_setup()
        m = torch.compile(m, mode="reduce-overhead" if v.how == "compile_ro" else None)
    return lambda: m(*xs)


def _compile_setup() -> None:
    """inductor's freezing (weights folded in, as for inference), and room in dynamo's
    cache: every compiled variant compiles the same forward code, one entry per precision
    and mode, and past its limit (8) dynamo would run eager without a word."""
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    inductor.freezing = True
    dynamo.recompile_limit = max(dynamo.recompile_limit, 64)


def build_variants(model: torch.nn.Module, inputs: Sequence[torch.Tensor],
                   variants: Sequence[GpuVariant], check: Callable[[object], float],
                   device: str = "cuda") -> tuple[dict, dict, dict]:
    """name -> zero-argument callable, name -> why it could not be built (printed on
    stderr and left out: each baseline fails alone), and name -> check(its output), taken
    at once (a graph's outputs are rewritten by its next replay)."""
    fns, failed, checked = {}, {}, {}
    for v in variants:
        try:
            with torch.no_grad(), precision_mode(v.precision):
                fn = build_variant(model, inputs, v, device)
                checked[v.name] = check(fn())
            fns[v.name] = fn
        except Exception as exc:  # this baseline's failure, not the run's
            failed[v.name] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"PyTorch {v.name} failed: {failed[v.name]}", file=sys.stderr)
    return fns, failed, checked
