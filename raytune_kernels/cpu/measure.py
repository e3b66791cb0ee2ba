"""Honest measurement of one built CPU candidate, in the process that runs it (the
MeasurerActor's, or a probe's child). Errors are data.

Inputs are random values generated here, never uninitialised memory (timed on empty
buffers, kernels came out up to 4x faster than on random values). The output is
checked against the task's torch reference before any time counts; then warm-up, `number`
grown until a repeat lasts min_repeat_ms, several repeats (every one kept), the median
reported; optionally the last-level cache is flushed before each repeat, and conv and dense
kernels read their weights from rotating copies that keep them out of cache.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from raytune_kernels.cpu.build import host_fault
from raytune_kernels.cpu.kernel import prepare
from raytune_kernels.cpu.schedules import lower, unpack
from raytune_kernels.measure import (HOST_ERROR, RUNTIME_ERROR, MeasureOptions, MeasureResult,
                                     check_output, last_task_operands, rotating_copies)
from raytune_kernels.precision import tolerance
from raytune_kernels.space import Config
from raytune_kernels.task import Compute
from raytune_kernels.timing import time_fn


@dataclass
class _Flusher:
    """Writes a buffer twice the size of the last-level cache."""

    buf: np.ndarray = field(default_factory=lambda: np.ones(_llc_bytes() // 4, np.float32))

    def __call__(self) -> None:
        self.buf += 1.0


def _llc_bytes() -> int:
    """Twice the last-level cache, in bytes."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()
        return int(text[:-1]) * 1024 * (1024 if text.endswith("M") else 1) * 2
    except (OSError, ValueError):
        return 64 << 20


def checked_as(cfg: Config, opts: MeasureOptions) -> MeasureOptions:
    """The options a config's output is checked with: AMX kernels round their operands
    to bf16, and take bf16's kernel tolerance where the options ask for less."""
    if cfg.get("algorithm") != "amx":
        return opts
    tol = tolerance("bf16")
    return replace(opts, rtol=max(opts.rtol, tol.kernel_rtol),
                   atol=max(opts.atol, tol.kernel_atol))


def measure_built(compute: Compute, cfg: Config, library: bytes, opts: MeasureOptions,
                  build_s: float = 0.0) -> MeasureResult:
    """Check then time a built candidate in this process."""
    start = time.perf_counter()
    try:
        nest = lower(compute, cfg)
        ops, expected = last_task_operands(compute, opts.seed)
        prep = prepare(compute, cfg, nest, library, ops, opts.threads)
        prep.run()
        got = unpack(compute, cfg, prep.buffers["out"])
    except Exception as exc:  # a broken candidate is data, not a crash of the measurer
        host = host_fault(exc)
        took = time.perf_counter() - start
        return MeasureResult.error(RUNTIME_ERROR if host is None else HOST_ERROR,
                                   host or f"{type(exc).__name__}: {exc}", build_s, took,
                                   (("check", took),))
    verdict = check_output(got, expected, checked_as(cfg, opts))
    checked = time.perf_counter()
    load = prep.kernel.load_s
    checking = (("load", load), ("check", checked - start - load))
    if verdict is not None:
        return MeasureResult.error(*verdict, build_s, checked - start, checking)
    between = _Flusher() if opts.flush_cache else None
    run = prep.run
    copies = weight_copies(compute, prep) if opts.cold_weights else 0
    if copies > 1:
        prep.rotate("b", copies)
        run = prep.cold_run
    times = time_fn(run, opts.timing(), between)
    end = time.perf_counter()
    return MeasureResult(tuple(times), None, "", build_s, end - start,
                         checking + (("timing", end - checked),))


def cold_copies(nbytes: int, cache_bytes: int | None = None) -> int:
    """rotating_copies of a buffer of `nbytes` over twice the last-level cache (tiny
    buffers then come from L3, not L1 or L2)."""
    return rotating_copies(nbytes, cache_bytes or _llc_bytes())


def weight_copies(compute: Compute, prep, cache_bytes: int | None = None) -> int:
    """cold_copies of a kernel's weights; 0 for kernels without a weight operand."""
    if compute.op not in ("conv2d", "dense") or "b" not in prep.buffers:
        return 0
    return cold_copies(prep.buffers["b"].nbytes, cache_bytes)
