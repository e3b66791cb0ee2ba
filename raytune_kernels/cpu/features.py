"""Features of a lowered candidate that mean the same thing for every task, so one cost
model learns from all tasks (in the spirit of Ansor's per-store features).

Read off the loop nest: op kind and algorithm (direct, im2col, Winograd), vector width
and blocks, register tile shape and accumulator pressure, loop extents by nesting level
and kind, unrolled work per innermost iteration, parallel extent against cores (and its
load imbalance), bytes the kernel touches and bytes touched per register tile against
L1/L2/L3, FLOPs and arithmetic intensity, and the layout knobs.
"""
from __future__ import annotations

import math
import os


from raytune_kernels.cpu.machine import CpuInfo
from raytune_kernels.cpu.loopnest import PARALLEL, UNROLL, For, LoopNest, Reduce, UpdateTile
from raytune_kernels.cpu.schedules import lower
from raytune_kernels.cpu.winograd import VARIANTS as WINOGRAD
from raytune_kernels.space import Config
from raytune_kernels.task import Compute

OPS = ("conv2d", "dense", "matmul", "max_pool2d", "avg_pool2d", "softmax", "layer_norm",
       "elementwise", "reduce")
MAX_LOOPS = 8
THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def _log(x: float) -> float:
    return math.log2(max(x, 1.0))


def _loops(body, depth: int = 0, out: list | None = None) -> list[tuple[int, For]]:
    out = [] if out is None else out
    for s in body:
        if isinstance(s, For):
            out.append((depth, s))
            _loops(s.body, depth + 1, out)
    return out


def _updates(body, out: list | None = None) -> list:
    out = [] if out is None else out
    for s in body:
        if isinstance(s, For):
            _updates(s.body, out)
        elif isinstance(s, (UpdateTile, Reduce)):
            out.append(s)
    return out


def featurize_nest(compute: Compute, cfg: Config, nest: LoopNest, cpu: CpuInfo) -> list[float]:
    f: list[float] = [float(compute.op == op) for op in OPS]
    f.append(float(cfg.get("algorithm") == "im2col"))
    winograd = WINOGRAD.get(cfg.get("algorithm"))
    f.append(winograd.m / 2 if winograd else 0.0)  # 1 for F(2x2), 2 for F(4x4)
    tile = max(nest.tiles, key=lambda t: t.rows * t.vecs, default=None)
    rows, cols, vecs = (tile.shape[0], tile.shape[1], tile.vecs) if tile else (1, 1, 1)
    accs = rows * cols * vecs
    f += [nest.lanes, vecs, rows, cols, accs, accs / cpu.regs,
          float(accs >= cpu.chains(nest.lanes))]
    # the loops around the tile updates first (a Winograd or im2col kernel's GEMM, whose
    # order decides its speed), then its transforms' or copies' (up to four rectangles of
    # tiles each where the output is ragged): the same features for the same GEMM
    around = {id(s) for s in nest.body if _updates([s])}
    loops = _loops(sorted(nest.body, key=lambda s: id(s) not in around))  # stable
    ext = [(_log(l.extent), float(l.kind == UNROLL), float(l.kind == PARALLEL))
           for _, l in loops[:MAX_LOOPS]]
    ext += [(0.0, 0.0, 0.0)] * (MAX_LOOPS - len(ext))
    f += [v for triple in ext for v in triple]
    unrolled = math.prod(l.extent for _, l in loops if l.kind == UNROLL) or 1
    f += [_log(unrolled), _log(unrolled * accs), float(len(loops))]
    par = [l.extent for _, l in loops if l.kind == PARALLEL]
    threads = THREADS
    p = par[0] if par else 1
    f += [_log(p), math.ceil(p / threads) * threads / p, float(bool(par))]
    total = sum(b.size for b in nest.buffers) * 4
    flops = max(compute.flops(), 1)
    f += [_log(flops), _log(total), flops / total]
    per_tile = _tile_bytes(cfg, rows, cols, vecs, nest.lanes)
    caches = cpu.machine.caches  # the host's sizes, not one CPU family's
    f += [_log(per_tile)] + [float(per_tile <= c) for c in caches]
    f += [float(total <= c) for c in caches]
    f += [_log(cfg.get("cb", 1)), float(cfg.get("out_layout") == "nhwc"),
          float(cfg.get("unroll", False)), float(cfg.get("parallel", 0) or 0),
          float(cfg.get("accs", 0) or 0), _log(cfg.get("prefetch_b", 0))]
    return f


def _tile_bytes(cfg: Config, rows: int, cols: int, vecs: int, lanes: int) -> float:
    """Bytes one register tile reads per channel block: A scalars and B vectors."""
    cb = cfg.get("cb", 1)
    return 4.0 * cb * (rows * cols + vecs * lanes)


def featurize(compute: Compute, cfg: Config, cpu: CpuInfo) -> list[float]:
    """Features of a config on the CPU it is tuned for, read off its loop nest."""
    return featurize_nest(compute, cfg, lower(compute, cfg), cpu)

