"""Features of a CUDA candidate, read off its rendered kernel without a GPU or a build.

The same meaning for every task, so one cost model learns across tasks: the kernel family
and op, the block shape and the grid against the SMs of the arch (waves, the tail of the
last wave), shared memory per block and the occupancy it and the block size allow, the
work and register tile of one thread, the schedule's knobs (tiles, vector widths, unroll),
FLOPs, bytes touched and arithmetic intensity. Registers are not among them: they are
known only after ptxas ran, and search scores hundreds of candidates per batch.
"""
from __future__ import annotations

import math
import re

from raytune_kernels.cuda.kernel import CudaKernel
from raytune_kernels.cuda.mma import MMA_PRECISIONS
from raytune_kernels.cuda.render import GEMM_OPS, render_cuda
from raytune_kernels.cuda.row_kernels import ROW_OPS
from raytune_kernels.cuda.window import WINDOW_OPS, is_window
from raytune_kernels.cuda.gpu import GpuInfo
from raytune_kernels.space import Config
from raytune_kernels.task import Compute

FAMILIES = ("gemm", "window", "rows", "elementwise")
OPS = GEMM_OPS + WINDOW_OPS + ROW_OPS + ("elementwise",)
SIZE_KNOBS = ("bm", "bn", "bk", "tm", "tn", "va", "vb", "tw", "vec", "items", "wm", "wn",
              "warps_m", "warps_n", "stages", "split")
WARP = 32
_SHARED = re.compile(r"__shared__[^;]*?\bfloat\s+\w+((?:\[\d+\])+)\s*;")


def _log(x: float) -> float:
    """log2, for ratios below 1 too (a grid of a tenth of a wave, half an output per
    thread); floored so that an empty kernel stays finite."""
    return math.log2(max(x, 2.0 ** -20))


def family(compute: Compute) -> str:
    """Which CUDA kernel family renders the compute (as cuda_render dispatches)."""
    if compute.op in ROW_OPS:
        return "rows"
    if compute.op == "elementwise":
        return "elementwise"
    return "window" if is_window(compute) else "gemm"


def shared_bytes(kernel: CudaKernel) -> int:
    """Shared memory per block: the static float arrays of the source plus the dynamic."""
    static = sum(4 * math.prod(int(d) for d in re.findall(r"\d+", dims))
                 for dims in _SHARED.findall(kernel.source))
    return static + kernel.smem_bytes


def blocks_per_sm(threads: int, smem: int, gpu: GpuInfo) -> int:
    """Resident blocks per SM allowed by the block size, shared memory and the block cap
    (registers would lower it further; they are unknown before a build)."""
    warps = math.ceil(threads / WARP) * WARP
    by_smem = gpu.smem_per_sm // smem if smem else gpu.max_blocks_per_sm
    return max(0, min(gpu.max_blocks_per_sm, gpu.max_threads_per_sm // warps, by_smem))


def _occupancy(kernel: CudaKernel, gpu: GpuInfo) -> list[float]:
    threads, blocks = kernel.threads, math.prod(kernel.grid)
    smem = shared_bytes(kernel)
    resident = blocks_per_sm(threads, smem, gpu)
    waves = blocks / (gpu.sms * max(resident, 1))
    return [_log(threads), math.ceil(threads / WARP), _log(blocks), _log(smem or 1),
            float(resident), resident * threads / gpu.max_threads_per_sm, _log(waves),
            waves / math.ceil(waves), min(1.0, blocks / gpu.sms),
            _log(blocks * threads / (gpu.sms * gpu.max_threads_per_sm))]


def _thread_work(compute: Compute, cfg: Config, kernel: CudaKernel) -> list[float]:
    """Outputs and FLOPs per thread, and the register tile of one thread."""
    launched = math.prod(kernel.grid) * kernel.threads
    tile = cfg.get("tm", 1) * cfg.get("tn", 1) * cfg.get("tw", 1) * cfg.get("items", 1)
    bm, bn = cfg.get("bm", 1), cfg.get("bn", 1)
    if cfg.get("kernel") == "mma":  # a warp's tile, spread over its 32 lanes
        tile = cfg["wm"] * cfg["wn"] / WARP
        bm, bn = cfg["wm"] * cfg["warps_m"], cfg["wn"] * cfg["warps_n"]
    return [_log(compute.output.numel / launched), _log(compute.flops() / launched),
            _log(tile), bm * bn / (bm + bn)]


def _knobs(cfg: Config) -> list[float]:
    """Every family's size knobs (log2, 0 where the family has none), interleave, unroll,
    whether activations are NHWC, register prefetch, whether the kernel runs on tensor
    cores and in which precision."""
    mma = cfg.get("kernel") == "mma"
    return ([_log(cfg.get(k, 1)) for k in SIZE_KNOBS]
            + [float(bool(cfg.get("interleave", False))), float(cfg.get("unroll", 0)),
               float(cfg.get("layout") == "NHWC"), float(bool(cfg.get("prefetch", False))),
               float(mma)]
            + [float(mma and cfg.get("precision") == p) for p in MMA_PRECISIONS])


def _traffic(compute: Compute, kernel: CudaKernel) -> list[float]:
    touched = 4 * sum(b.size for b in kernel.buffers)
    flops = max(compute.flops(), 1)
    return [_log(flops), _log(touched), flops / touched]


def featurize_cuda(compute: Compute, cfg: Config, gpu: GpuInfo) -> list[float]:
    """The feature vector of one CUDA config (the same length for every compute)."""
    kernel = render_cuda(compute, cfg)
    fam = family(compute)
    return ([float(fam == f) for f in FAMILIES] + [float(compute.op == op) for op in OPS]
            + _occupancy(kernel, gpu) + _thread_work(compute, cfg, kernel) + _knobs(cfg)
            + _traffic(compute, kernel))
