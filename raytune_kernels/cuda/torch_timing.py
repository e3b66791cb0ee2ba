"""PyTorch on a CUDA GPU, timed the way our GPU records are timed (bench/kernels.py,
bench/network.py and `raytune-kernels compile --target cuda` compare against it).

- TF32 off (cuBLAS and cuDNN would otherwise round float32 inputs to TF32 in matmuls and
  convolutions; our kernels are true float32) and cudnn.benchmark on (cuDNN picks its
  fastest algorithm per shape: torch at its best), both only inside `torch_gpu_mode()`.
- The timing protocol of cuda/measure.py: warm-up, CUDA events (cuda/device.event_timer)
  around `number` calls grown until one repeat lasts min_repeat_ms, several repeats, and
  with flush_cache the L2 flushed before each repeat (cuda/device.l2_flusher).

The events are recorded on cupy's current stream and torch launches on its own current
stream; both are the legacy default stream unless someone changes them, so the events
bracket torch's kernels (compile/cuda_network.CupyDevice relies on the same). Nothing here touches
CUDA at import: the module imports on machines without a GPU, cupy or torch CUDA.
"""
from __future__ import annotations

import copy
import os
from typing import Callable, Sequence

import torch

from raytune_kernels.errors import RaytuneError
from raytune_kernels.cuda import device
from raytune_kernels.cuda.device import torch_gpu_mode
from raytune_kernels.tune.timing import TimingOptions, time_runs

NO_GPU = "no CUDA GPU is visible"


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
    """The product name of torch's current CUDA device, e.g. "NVIDIA H100 80GB HBM3"."""
    return torch.cuda.get_device_name(torch.cuda.current_device())


def time_torch_gpu(fn: Callable[[], object], opts: TimingOptions,
                   flush_cache: bool = False, cp=None) -> list[float]:
    """Seconds per call of `fn` (torch work on the GPU), one per repeat: inside
    torch_gpu_mode and no_grad, `opts.warmup` calls (cuDNN's autotuning happens there),
    then cuda/measure.py's protocol by CUDA events, the L2 flushed before each repeat with
    `flush_cache`. `cp` is cupy (tests pass a fake)."""
    cp = cp if cp is not None else device.cupy()
    with torch.no_grad(), torch_gpu_mode():
        for _ in range(opts.warmup):
            fn()
        flush = device.l2_flusher(cp) if flush_cache else None
        return time_runs(device.event_timer(fn, cp), opts, flush)


def on_gpu(model: torch.nn.Module, inputs: Sequence[torch.Tensor],
           channels_last: bool = False, device: str = "cuda"
           ) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A copy of `model` in eval mode and copies of `inputs` on `device` (the caller's
    model stays where it is), optionally in channels_last (4-D tensors only)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    moved = copy.deepcopy(model).eval().to(device)
    if channels_last:
        moved = moved.to(memory_format=fmt)
    xs = tuple(x.to(device).contiguous(memory_format=fmt) if x.dim() == 4 else x.to(device)
               for x in inputs)
    return moved, xs
