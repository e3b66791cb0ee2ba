"""Candidate kernels end to end: lower, render, build, load, run on torch operands."""
from __future__ import annotations

import ctypes
import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from raytune_kernels.task import Compute
from raytune_kernels.cpu.build import BuildResult, LoadedKernel, aligned, build, timed
from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.cpu.loopnest import LoopNest
from raytune_kernels.cpu.schedules import lower, pack, unpack
from raytune_kernels.space import Config

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
        their layer's turn comes (timing one copy in a loop keeps it in cache)."""
        i = self.order.index(name)
        self._rotation = []
        for _ in range(copies):
            copy = aligned(self.buffers[name])
            args = list(self._args)
            args[i] = ctypes.c_void_p(copy.ctypes.data)
            self._rotation.append((args, copy))

    def cold_run(self) -> None:
        self._turn = (self._turn + 1) % len(self._rotation)
        self.kernel.fn(*self._rotation[self._turn][0])


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
