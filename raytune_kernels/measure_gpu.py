"""Honest measurement of one built CUDA candidate on this process's GPU. Errors are data.

The same protocol as measure.py, on the device: operands are the measurer's own random
values (random_operands), the output buffer starts as NaN so an element the kernel never
writes fails the check, the output is compared with reference() (on the GPU through torch
when torch has CUDA, with TF32 off so the reference is true float32; on the CPU otherwise)
before any time counts; then warm-up, `number` grown until one repeat lasts
min_repeat_ms, several repeats timed with CUDA events, and with flush_cache the L2 is
flushed before each repeat by writing a buffer twice its size.

A kernel that faults (illegal address, misaligned access, ...) leaves the CUDA context
unusable for the rest of the process: that comes back as CRASHED with `poisoned` in the
message, and whoever owns the process must end it (actors/gpu_measure.py does).
CuPy and the GPU are touched only inside functions, so this module imports without them.
"""
from __future__ import annotations

import os
import tempfile
import time

import torch

from .codegen.cuda_kernel import CudaKernel
from .codegen.cuda_render import cuda_pack, cuda_unpack
from .codegen.cuda_render import render_cuda
from .codegen.space import Config
from .measure import CRASHED, RUNTIME_ERROR, MeasureOptions, MeasureResult, check_output, \
    random_operands
from .reference import reference
from .task import Compute
from .timing import time_runs
from .torch_gpu import torch_gpu_mode

# CUDA errors after which the context is corrupt (the same codes in the driver and runtime
# APIs): launch timeout, device assert, stack error, illegal instruction, misaligned
# address, invalid address space, invalid PC, launch failure, illegal address.
STICKY_ERRORS = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})
POISONED = "CUDA context poisoned"


def _cupy():
    import cupy  # a heavy optional dependency: only where a GPU is used

    return cupy


def gpu_count() -> int:
    """CUDA devices visible to this process; 0 without cupy, a driver or a GPU."""
    try:
        return int(_cupy().cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def device_arch(device: int = 0) -> str:
    """The NVRTC arch of a device, e.g. "sm_90" for an H100 (what builders target)."""
    return f"sm_{_cupy().cuda.Device(device).compute_capability}"


def device_name(device: int = 0) -> str:
    """The product name of a device, e.g. "NVIDIA H100 80GB HBM3"."""
    name = _cupy().cuda.runtime.getDeviceProperties(device)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def is_sticky(exc: BaseException) -> bool:
    """Whether a CUDA error leaves the context unusable (the process must end)."""
    status = getattr(exc, "status", None)
    return status in STICKY_ERRORS or "illegal memory access" in str(exc)


class LoadedKernel:
    """A cupy RawKernel loaded from cubin or PTX bytes (cubins are ELF files). The file
    RawModule reads stays until this object goes, in case cupy loads it lazily."""

    def __init__(self, binary: bytes, name: str):
        cp = _cupy()
        self._dir = tempfile.TemporaryDirectory(prefix="rk_cuda_")
        path = os.path.join(self._dir.name, name + (".cubin" if binary[:4] == b"\x7fELF"
                                                    else ".ptx"))
        with open(path, "wb") as f:
            f.write(binary)
        self.module = cp.RawModule(path=path)
        self.fn = self.module.get_function(name)


def gpu_reference(compute: Compute, operands: list[torch.Tensor]) -> torch.Tensor:
    """reference() on the GPU when torch can use it, else on the CPU; a CPU tensor."""
    with torch.no_grad():
        if not torch.cuda.is_available():
            return reference(compute, *operands)
        with torch_gpu_mode(benchmark=False):
            return reference(compute, *(x.cuda() for x in operands)).cpu()


class Launch:
    """One kernel with its device buffers: call it to enqueue a launch."""

    def __init__(self, kernel: CudaKernel, loaded: LoadedKernel, arrays):
        cp = _cupy()
        self.kernel, self.loaded, self.fn = kernel, loaded, loaded.fn
        self.buffers = [cp.asarray(a) for a in arrays]
        self.buffers[-1].fill(float("nan"))

    def __call__(self) -> None:
        k = self.kernel
        self.fn(k.grid, k.block, tuple(self.buffers), shared_mem=k.smem_bytes)

    def output(self):
        return _cupy().asnumpy(self.buffers[-1])


def event_timer(launch, cp):
    """run(number): seconds for `number` back-to-back launches, by CUDA events."""
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def run(number: int) -> float:
        start.record()
        for _ in range(number):
            launch()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3
    return run


def l2_flusher(cp):
    """Writes a buffer twice the L2's size: the next repeat starts with a cold L2."""
    size = int(cp.cuda.Device().attributes.get("L2CacheSize", 50 << 20)) * 2
    buf = cp.zeros(max(size // 4, 1 << 20), dtype=cp.float32)

    def flush() -> None:
        cp.add(buf, 1.0, out=buf)
    return flush


def measure_built_gpu(compute: Compute, cfg: Config, binary: bytes, opts: MeasureOptions,
                      build_s: float = 0.0, device: int = 0) -> MeasureResult:
    """Check then time a built CUDA candidate (cubin or PTX bytes) on `device`."""
    start = time.perf_counter()

    def failed(exc: BaseException) -> MeasureResult:
        sticky = is_sticky(exc)
        msg = f"{POISONED}: " if sticky else ""
        return MeasureResult.error(CRASHED if sticky else RUNTIME_ERROR,
                                   f"{msg}{type(exc).__name__}: {exc}", build_s,
                                   time.perf_counter() - start)
    if gpu_count() <= device:
        return MeasureResult.error(RUNTIME_ERROR, f"no CUDA GPU {device} in this process "
                                   f"({gpu_count()} visible)", build_s)
    try:
        cp = _cupy()
        ops = random_operands(compute, opts.seed)
        expected = gpu_reference(compute, ops)
        with cp.cuda.Device(device):
            kernel = render_cuda(compute, cfg)
            launch = Launch(kernel, LoadedKernel(binary, kernel.name), cuda_pack(compute, ops, cfg))
            launch()
            cp.cuda.Device(device).synchronize()
            got = cuda_unpack(compute, launch.output(), cfg)
    except Exception as exc:  # a broken candidate is data, not a crash of the measurer
        return failed(exc)
    verdict = check_output(got, expected, opts)
    if verdict is not None:
        return MeasureResult.error(*verdict, build_s, time.perf_counter() - start)
    try:
        with cp.cuda.Device(device):
            for _ in range(opts.warmup):
                launch()
            flush = l2_flusher(cp) if opts.flush_cache else None
            times = time_runs(event_timer(launch, cp), opts.timing(), flush)
    except Exception as exc:
        return failed(exc)
    return MeasureResult(tuple(times), None, "", build_s, time.perf_counter() - start)
