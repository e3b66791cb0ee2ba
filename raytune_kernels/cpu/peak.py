"""The machine's FMA peak, measured through our own IR and builder.

A parallel loop of one iteration per thread; each runs a long reduction of independent
accumulator chains (as many as the register file holds) on L1-resident operands.
"""
from __future__ import annotations

import numpy as np

from raytune_kernels.timing import TimingOptions, median, time_fn
from raytune_kernels.cpu.build import LoadedKernel, aligned, build
from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.cpu.loopnest import (PARALLEL, SERIAL, Access, Affine, Buffer, UpdateTile,
                                          For, LoopNest, Split, StoreTile, Tile, ZeroTile)

STEPS = 200000


def peak_nest(threads: int, lanes: int, regs: int) -> LoopNest:
    vecs = 2
    cols = (regs - vecs - 2) // vecs
    tile = Tile("t", (1, cols), vecs)
    width = cols * vecs * lanes
    body = (For("p", threads, PARALLEL, (
        Split("p", ("q",), (threads,)),
        ZeroTile("t"),
        For("k", STEPS, SERIAL, (UpdateTile("t", Access("a", Affine()), (0, 1),
                                         Access("b", Affine())),)),
        StoreTile("t", Access("out", Affine((("q", width),))), (0, vecs * lanes)),
    )),)
    bufs = (Buffer("a", cols, "in"), Buffer("b", vecs * lanes, "in"),
            Buffer("out", threads * width, "out"))
    return LoopNest("fma_peak", bufs, (tile,), body, lanes)


def measure_peak(threads: int, lanes: int, regs: int,
                 opts: TimingOptions = TimingOptions()) -> float:
    """GFLOP/s of `lanes`-float FMAs (the widest the host has) on `threads` threads."""
    nest = peak_nest(threads, lanes, regs)
    result = build(render(nest))
    if result.error:
        raise RuntimeError(result.error)
    kernel = LoadedKernel(result.library, nest.name, len(nest.buffers))
    rng = np.random.default_rng(0)
    bufs = [aligned(rng.standard_normal(b.size).astype(np.float32) * 1e-3) for b in nest.buffers]
    seconds = median(time_fn(lambda: kernel([b.ctypes.data for b in bufs], threads), opts))
    tile = nest.tiles[0]
    flops = threads * STEPS * tile.rows * tile.vecs * nest.lanes * 2
    return flops / seconds / 1e9
