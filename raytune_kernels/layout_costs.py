"""Measured inputs of the layout problem: node candidates from records, edge costs from
timing the layout-transform kernels with the same protocol as every other kernel."""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .codegen.build import LoadedKernel, build
from .codegen.kernel import aligned
from .codegen.llvm_ir import render
from .codegen.space import Config
from .codegen.transform import Layout, transform_nest, transform_space
from .layout_graph import Candidate
from .measure import MeasureOptions
from .records import Record
from .task import Task
from .timing import median, time_fn

PLAIN = "NCHW"


def layouts_of(task: Task, cfg: Config) -> tuple[str, str]:
    """(input layout, output layout) a config's kernel reads and writes."""
    c = task.compute
    if c.op not in ("conv2d", "max_pool2d", "avg_pool2d") or len(c.output.shape) != 4:
        return PLAIN, PLAIN
    ob = cfg["ob"]
    if "cb" not in dict(cfg.knobs):  # depthwise and pooling: the channel block is the vector
        return f"NCHW{ob}c", f"NCHW{ob}c"
    cb, channels = cfg["cb"], c.inputs[0].shape[1]
    src = PLAIN if cb == 1 else "NHWC" if cb == channels else f"NCHW{cb}c"
    dst = "NHWC" if cfg.get("out_layout") == "nhwc" else f"NCHW{ob}c"
    return src, dst


def candidates_from_records(task: Task, records: list[Record]) -> list[Candidate]:
    """The best measured kernel of `task` for each (input, output) layout pair."""
    best: dict[tuple[str, str], float] = {}
    for r in records:
        if r.task_key == task.key and r.ok:
            pair = layouts_of(task, Config.from_json(r.config))
            best[pair] = min(best.get(pair, math.inf), r.median)
    return [Candidate(a, b, t) for (a, b), t in sorted(best.items())]


@functools.lru_cache(maxsize=4096)
def transform_seconds(shape: tuple[int, ...], src: str, dst: str,
                      opts: MeasureOptions = MeasureOptions()) -> float:
    """Median time of the fastest transform kernel src -> dst for a (1, C, H, W) tensor,
    checked exact on random input; 0 when the layouts match, inf when one cannot hold it."""
    if src == dst:
        return 0.0
    try:
        Layout(src).check(shape[1])
        Layout(dst).check(shape[1])
    except ValueError:
        return math.inf
    x = torch.randn(shape, generator=torch.Generator().manual_seed(opts.seed))
    best = math.inf
    for cfg in transform_space(shape, src, dst):
        best = min(best, _time_one(shape, src, dst, cfg, x, opts))
    return best


def _time_one(shape, src: str, dst: str, cfg: Config, x: torch.Tensor, opts) -> float:
    nest = transform_nest(shape, src, dst, cfg)
    built = build(render(nest))
    if built.error:
        return math.inf
    kernel = LoadedKernel(built.library, nest.name, 2)
    inp, out = aligned(Layout(src).pack(x)), aligned(np.zeros(x.numel(), np.float32))
    run = lambda: kernel([inp.ctypes.data, out.ctypes.data], opts.threads)  # noqa: E731
    run()
    if not torch.equal(Layout(dst).unpack(out, shape), x):
        return math.inf  # a wrong transform never counts
    return median(time_fn(run, opts.timing()))
