"""Candidate kernels end to end: lower, render, build, load, run on torch operands."""
from __future__ import annotations

import ctypes
import dataclasses
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.task import Compute
from raytune_kernels.cpu.build import (ALIGN, HUGE, BuildResult, LoadedKernel, aligned,
                                      aligned_empty, build, timed)
from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.cpu.loopnest import LoopNest
from raytune_kernels.cpu.schedules import lower, pack, unpack
from raytune_kernels.space import Config

if TYPE_CHECKING:
    import torch

def build_candidate(compute: Compute, cfg: Config, mcpu: str | None = None
                    ) -> tuple[LoopNest, BuildResult]:
    """Lower, render and build; the result's seconds and phases include the "render"
    phase (lowering and IR text) before the build's own."""
    rendered: list[tuple[str, float]] = []
    with timed("render", rendered):
        nest = lower(compute, cfg)
        text = render(nest)
    built = build(text, mcpu)
    return nest, dataclasses.replace(built, seconds=rendered[0][1] + built.seconds,
                                     phases=tuple(rendered) + built.phases)


@dataclass
class PreparedRun:
    """A loaded kernel with its buffers packed and aligned: call run() to execute it.

    The call's arguments are converted to ctypes once, here, not on every run: run() sits
    inside the timing loop, where per-call Python work would be counted as kernel time."""

    kernel: LoadedKernel
    buffers: dict[str, np.ndarray]
    order: tuple[str, ...]
    threads: int

    def __post_init__(self) -> None:
        self._args = [ctypes.c_void_p(self.buffers[n].ctypes.data) for n in self.order]
        self._args.append(ctypes.c_int32(self.threads))
        self._rotation: list[list] = []
        self._turn = 0

    def run(self) -> None:
        self.kernel.fn(*self._args)

    def rotate(self, name: str, copies: int) -> None:
        """From now on, cold_run() reads buffer `name` from one of `copies` identical
        copies in turn, so each call finds it out of cache, as a network's weights are when
        their layer's turn comes (timing one copy in a loop keeps it in cache).
        The copies live in memory this process keeps for them (twice the last-level
        cache: allocating and faulting it in anew was 10-40 ms of each candidate's ~110 ms
        measurement), lent to one PreparedRun at a time: a later rotate() takes it back,
        and this run's cold_run() then refuses to run rather than read another's data."""
        i, src = self.order.index(name), self.buffers[name]
        # each copy starts on a cache line, and on a huge page where it spans one
        unit = HUGE // 4 if src.nbytes >= HUGE else ALIGN // 4
        step = -(-src.size // unit) * unit
        memory = _rotation_memory(self, step * copies + unit)
        first = (-memory.ctypes.data % (unit * 4)) // 4
        self._rotation = []
        for k in range(copies):
            copy = memory[first + k * step: first + k * step + src.size]
            copy[:] = src
            args = list(self._args)
            args[i] = ctypes.c_void_p(copy.ctypes.data)
            self._rotation.append((args, copy))

    def cold_run(self) -> None:
        if not self._rotation:
            raise RuntimeError("cold_run() without rotating copies: rotate() first (another "
                               "PreparedRun's rotate() takes the copies' memory back)")
        self._turn = (self._turn + 1) % len(self._rotation)
        self.kernel.fn(*self._rotation[self._turn][0])


_ROTATION: dict = {}  # "memory": the floats, "user": weakref to the PreparedRun using them


def _rotation_memory(user: PreparedRun, n: int) -> np.ndarray:
    """At least n floats for `user`'s rotating copies, taken back from whoever had them."""
    previous = _ROTATION.get("user")
    if previous is not None and previous() is not None and previous() is not user:
        previous()._rotation = []
    memory = _ROTATION.get("memory")
    if memory is None or memory.size < n:
        memory = aligned_empty(n)
        _ROTATION["memory"] = memory
    _ROTATION["user"] = weakref.ref(user)
    return memory


def prepare(compute: Compute, cfg: Config, nest: LoopNest, library: bytes, operands,
            threads: int) -> PreparedRun:
    bufs = {k: aligned(v) for k, v in pack(compute, cfg, operands).items()}
    order = tuple(b.name for b in nest.buffers)
    return PreparedRun(LoadedKernel(library, nest.name, len(order)), bufs, order, threads)


def run_candidate(compute: Compute, cfg: Config, operands, threads: int = 1,
                  mcpu: str | None = None) -> torch.Tensor:
    """Build and run one candidate on reference-order operands; returns the output."""
    nest, result = build_candidate(compute, cfg, mcpu)
    if result.error:
        raise RuntimeError(result.error)
    prep = prepare(compute, cfg, nest, result.library, operands, threads)
    prep.run()
    return unpack(compute, cfg, prep.buffers["out"])


def build_for(compute: Compute, cfg: Config, mcpu: str | None = None) -> BuildResult:
    """Lower, render and build; any failure (a config that does not lower included) comes
    back as a BuildResult with its error, never as an exception."""
    start = time.perf_counter()
    try:
        return build_candidate(compute, cfg, mcpu)[1]
    except Exception as exc:  # lowering or rendering failed: all of it was "render"
        took = time.perf_counter() - start
        return BuildResult(None, f"{type(exc).__name__}: {exc}", took, False,
                           (("render", took),))
