"""Honest measurement of one built CUDA candidate on this process's GPU. Errors are data.

The same protocol as measure.py, on the device: operands are the measurer's own random
values (random_operands), the output buffer starts as NaN so an element the kernel never
writes fails the check, the output is compared with reference() (on the GPU through torch
when torch has CUDA, with TF32 off so the reference is true float32; on the CPU otherwise)
before any time counts; then warm-up, `number` grown until one repeat lasts
min_repeat_ms, several repeats timed with CUDA events, and with flush_cache the L2 is
flushed before each repeat by writing a buffer twice its size. A repeat replays its
`number` launches from CUDA graphs of a few hundred launches each, back to back, as a
compiled network replays its kernels (cuda/device.graph_timer): a kernel shorter than the
host's time to issue a launch is timed as it runs there, not at the launch rate of a loop
in Python. With cold_weights a conv's or dense's launches read their weights from
rotating copies that together cover twice the L2 (device.weight_copies), as a network reads
every layer's weights from memory (the L2 flush alone makes only a repeat's first launch
cold); a graph holds whole cycles of the copies. The operands and the reference are drawn once for the
task measured last (measure.last_task_operands), as on a CPU.

A kernel that faults (illegal address, misaligned access, ...) leaves the CUDA context
unusable for the rest of the process: that comes back as CRASHED with `poisoned` in the
message, and whoever owns the process must end it (actors/gpu_measure.py does).
CuPy and the GPU are touched only inside functions, so this module imports without them.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from raytune_kernels.cuda.render import cuda_pack, cuda_unpack
from raytune_kernels.cuda.render import config_precision, render_cuda
from raytune_kernels.precision import tolerance
from raytune_kernels.space import Config
from raytune_kernels.measure import (CRASHED, RUNTIME_ERROR, MeasureOptions, MeasureResult,
                                     check_output, last_task_operands)
from raytune_kernels.frontend.reference import reference
from raytune_kernels.task import Compute
from raytune_kernels.timing import time_runs
from raytune_kernels.cuda import device as cuda_device
from raytune_kernels.cuda.device import POISONED, Launch, LoadedCudaKernel, torch_gpu_mode

def gpu_reference(compute: Compute, operands: list[torch.Tensor]) -> torch.Tensor:
    """reference() on the GPU when torch can use it, else on the CPU; a CPU tensor."""
    with torch.no_grad():
        if not torch.cuda.is_available():
            return reference(compute, *operands)
        with torch_gpu_mode(benchmark=False):
            return reference(compute, *(x.cuda() for x in operands)).cpu()


def checked_as(cfg: Config, opts: MeasureOptions) -> MeasureOptions:
    """The options a config's output is checked with: the tolerance of its precision
    (raytune_kernels/precision.py) where that is looser than the options' own."""
    tol = tolerance(config_precision(cfg))
    return replace(opts, rtol=max(opts.rtol, tol.kernel_rtol),
                   atol=max(opts.atol, tol.kernel_atol))


def measure_built_gpu(compute: Compute, cfg: Config, binary: bytes, opts: MeasureOptions,
                      build_s: float = 0.0, device: int = 0) -> MeasureResult:
    """Check then time a built CUDA candidate (cubin or PTX bytes) on `device`."""
    start = time.perf_counter()

    def failed(exc: BaseException) -> MeasureResult:
        sticky = cuda_device.is_sticky(exc)
        msg = f"{POISONED}: " if sticky else ""
        return MeasureResult.error(CRASHED if sticky else RUNTIME_ERROR,
                                   f"{msg}{type(exc).__name__}: {exc}", build_s,
                                   time.perf_counter() - start)
    if cuda_device.gpu_count() <= device:
        return MeasureResult.error(RUNTIME_ERROR, f"no CUDA GPU {device} in this process "
                                   f"({cuda_device.gpu_count()} visible)", build_s)
    try:
        cp = cuda_device.cupy()
        ops, expected = last_task_operands(compute, opts.seed, "gpu",
                                           lambda xs: gpu_reference(compute, xs))
        with cp.cuda.Device(device):
            kernel = render_cuda(compute, cfg)
            loading = time.perf_counter()
            loaded = LoadedCudaKernel(binary, kernel.name)
            load_s = time.perf_counter() - loading
            launch = Launch(kernel, loaded, cuda_pack(compute, ops, cfg))
            launch()
            cp.cuda.Device(device).synchronize()
            got = cuda_unpack(compute, launch.output(), cfg)
    except Exception as exc:  # a broken candidate is data, not a crash of the measurer
        return failed(exc)
    verdict = check_output(got, expected, checked_as(cfg, opts))
    checked = time.perf_counter()
    checking = (("load", load_s), ("check", checked - start - load_s))
    if verdict is not None:
        return MeasureResult.error(*verdict, build_s, checked - start, checking)
    try:
        with cp.cuda.Device(device):
            for _ in range(opts.warmup):
                launch()
            flush = cuda_device.l2_flusher(cp) if opts.flush_cache else None
            run = launch
            if opts.cold_weights and compute.op in ("conv2d", "dense"):
                weights = launch.buffers[1]
                run = launch.rotating(1, cuda_device.weight_copies(
                    weights.nbytes, cuda_device.l2_bytes(cp)))
            timer = cuda_device.graph_timer(cuda_device.launch_graph(run, cp), cp)
            times = time_runs(timer, opts.timing(), flush)
    except Exception as exc:
        return failed(exc)
    end = time.perf_counter()
    return MeasureResult(tuple(times), None, "", build_s, end - start,
                         checking + (("timing", end - checked),))
