"""Measured inputs of the layout problem: node candidates from records, edge costs from
timing the layout-transform kernels with the same protocol as every other kernel."""
from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
import torch

from raytune_kernels.cpu.build import LoadedKernel, aligned, build
from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.space import Config
from raytune_kernels.cpu.transform import Layout, blocks, transform_nest, transform_space
from raytune_kernels.layout.graph import Candidate
from raytune_kernels.measure import MeasureOptions, cold_copies
from raytune_kernels.tune.records import Record
from raytune_kernels.task import Task
from raytune_kernels.tune.timing import median, time_fn

PLAIN = "NCHW"
PARALLEL_FLOATS = 32 * 1024  # transforms of tensors this large run their outer loop parallel


def layouts_of(task: Task, cfg: Config) -> tuple[str, str]:
    """(input layout, output layout) a config's kernel reads and writes. Windowed kernels
    read their input with its padding as a border: NCHW16c/p1x1."""
    c = task.compute
    if c.op not in ("conv2d", "max_pool2d", "avg_pool2d") or len(c.output.shape) != 4:
        return PLAIN, PLAIN
    ob = cfg["ob"]
    pad = tuple(c.attr("padding") or (0, 0))
    if "cb" not in dict(cfg.knobs):  # depthwise and pooling: the channel block is the vector
        return Layout(f"NCHW{ob}c", pad).label, f"NCHW{ob}c"
    cb, channels = cfg["cb"], c.inputs[0].shape[1]
    src = PLAIN if cb == 1 else "NHWC" if cb == channels else f"NCHW{cb}c"
    dst = "NHWC" if cfg.get("out_layout") == "nhwc" else f"NCHW{ob}c"
    return Layout(src, pad).label, dst


def candidates_from_records(task: Task, records: list[Record], threads: int | None = None,
                            layouts: Callable[[Task, Config], tuple[str, str]] = layouts_of
                            ) -> list[Candidate]:
    """The best measured kernel of `task` for each (input, output) layout pair (among the
    records at `threads` threads, when given); each candidate carries its config.
    `layouts` says what a config reads and writes (the CPU's by default)."""
    best: dict[tuple[str, str], tuple[float, dict]] = {}
    for r in records:
        if r.task_key == task.key and r.ok and (threads is None or r.threads == threads):
            pair = layouts(task, Config.from_json(r.config))
            if pair not in best or r.median < best[pair][0]:
                best[pair] = (r.median, r.config)
    return [Candidate(a, b, t, Config.from_json(cfg))
            for (a, b), (t, cfg) in sorted(best.items())]


def transform_seconds(shape: tuple[int, ...], src: str, dst: str,
                      opts: MeasureOptions = MeasureOptions()) -> float:
    """Median time of the fastest transform kernel src -> dst (layout labels) for a
    (1, C, H, W) tensor, checked exact on random input; 0 when the layouts match, inf when
    one cannot hold the tensor."""
    return fastest_transform(shape, src, dst, opts)[0]


@functools.lru_cache(maxsize=4096)
def fastest_transform(shape: tuple[int, ...], src: str, dst: str,
                      opts: MeasureOptions = MeasureOptions()) -> tuple[float, Config | None]:
    """(seconds, config) of the fastest transform kernel src -> dst over its small space."""
    if src == dst or len(shape) != 4:
        return (0.0 if src == dst else math.inf), None
    try:
        s, d = Layout.parse(src), Layout.parse(dst)
        s.check(shape[1])
        d.check(shape[1])
        blocks(shape[1], s, d)
    except ValueError:  # a layout that cannot hold the tensor, or blocks that do not nest
        return math.inf, None
    x = torch.randn(shape, generator=torch.Generator().manual_seed(opts.seed))
    timed = [(_time_one(shape, s, d, cfg, x, opts), cfg) for cfg in _few_configs(shape)]
    return min(timed, key=lambda p: p[0])


def _few_configs(shape: tuple[int, ...]) -> list[Config]:
    """Transforms are copies: the tile width barely matters once it is a few columns, and
    the parallel loop pays off only on tensors past a few L1s. One config of the space,
    picked by those two facts, keeps a network's hundreds of edge timings (each a build) to
    a minute rather than several."""
    space = transform_space(shape, "NCHW", "NCHW")
    widths = sorted({c["tile_w"] for c in space}, key=lambda t: (abs(t - 8), -t))
    parallel = math.prod(shape) >= PARALLEL_FLOATS
    return [c for c in space if c["tile_w"] == widths[0] and c["parallel"] == parallel]


@functools.lru_cache(maxsize=4096)
def transform_kernel(shape: tuple[int, ...], src: Layout, dst: Layout, cfg: Config
                     ) -> LoadedKernel | None:
    """The built and loaded transform kernel (None when it does not build); cached, so the
    kernel timed for the layout problem is the one a compiled network calls."""
    nest = transform_nest(shape, src, dst, cfg)
    built = build(render(nest))
    return None if built.error else LoadedKernel(built.library, nest.name, 2)


def _time_one(shape, src: Layout, dst: Layout, cfg: Config, x: torch.Tensor, opts) -> float:
    kernel = transform_kernel(shape, src, dst, cfg)
    if kernel is None:
        return math.inf
    inp = aligned(src.pack(x))
    out = aligned(np.zeros(dst.size(shape), np.float32))
    kernel([inp.ctypes.data, out.ctypes.data], opts.threads)
    if not torch.equal(dst.unpack(out, shape), x):
        return math.inf  # a wrong transform never counts
    if not opts.cold_weights:
        return median(time_fn(lambda: kernel([inp.ctypes.data, out.ctypes.data],
                                             opts.threads), opts.timing()))
    # In a network the source was just written (cached) but the destination was last
    # touched an inference ago: write into rotating destinations, as the kernels' weights
    # rotate (warm destinations made transforms look 2-5x cheaper than in the network).
    outs = [out] + [aligned(out) for _ in range(cold_copies(out.nbytes) - 1)]
    ptrs = [(inp.ctypes.data, o.ctypes.data) for o in outs]
    turn = [0]

    def run() -> None:
        turn[0] = (turn[0] + 1) % len(ptrs)
        kernel(list(ptrs[turn[0]]), opts.threads)
    return median(time_fn(run, opts.timing()))

