"""Measured inputs of the layout problem: node candidates from records, edge costs from
timing the layout-transform kernels with the same protocol as every other kernel."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Iterable

import numpy as np

from raytune_kernels.cpu.build import LoadedKernel, aligned, build, keep
from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.space import Config
from raytune_kernels.cpu.transform import Layout, blocks, transform_nest, transform_space
from raytune_kernels.cpu.measure import cold_copies
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.task import Task
from raytune_kernels.timing import median, time_fn

if TYPE_CHECKING:
    import torch

PLAIN = "NCHW"
PARALLEL_FLOATS = 32 * 1024  # transforms of tensors this large run their outer loop parallel


def layouts_of(task: Task, cfg: Config) -> tuple[str, str]:
    """(input layout, output layout) a config's kernel reads and writes. Windowed kernels
    read their input with its padding as a border: NCHW16c/p1x1. A block of every channel
    is NHWC (NCHW64c of 64 channels is the same memory as NHWC), so that no transform is
    planned between the two and a reader's border is written by the producer itself."""
    c = task.compute
    if c.op not in ("conv2d", "max_pool2d", "avg_pool2d") or len(c.output.shape) != 4:
        return PLAIN, PLAIN
    ob = cfg["ob"]
    pad = tuple(c.attr("padding") or (0, 0))
    if "cb" not in dict(cfg.knobs):  # depthwise and pooling: one layout in and out, blocked
        # by the vector block or NHWC
        lay = "NHWC" if cfg.get("out_layout") == "nhwc" else _blocked(ob, c.output.shape[1])
        return Layout(lay, pad).label, lay
    cb, channels = cfg["cb"], c.inputs[0].shape[1]
    if cfg.get("in_layout") == "nhwc":  # blocks of cb read from NHWC (schedules.nhwc_reader)
        src = "NHWC"
    else:
        src = PLAIN if cb == 1 else _blocked(cb, channels)
    dst = "NHWC" if cfg.get("out_layout") == "nhwc" else _blocked(ob, c.output.shape[1])
    return Layout(src, pad).label, dst


def _blocked(block: int, channels: int) -> str:
    """The label of channels in blocks of `block`: NHWC where one block holds them all."""
    return "NHWC" if block == channels else f"NCHW{block}c"


def transform_seconds(shape: tuple[int, ...], src: str, dst: str,
                      opts: MeasureOptions = MeasureOptions()) -> float:
    """Median time of the fastest transform kernel src -> dst (layout labels) for a
    (1, C, H, W) tensor, checked exact on random input; 0 when the layouts match, inf when
    one cannot hold the tensor."""
    return fastest_transform(shape, src, dst, opts)[0]


def fastest_transform(shape: tuple[int, ...], src: str, dst: str,
                      opts: MeasureOptions = MeasureOptions()) -> tuple[float, Config | None]:
    """(seconds, config) of the fastest transform kernel src -> dst over its small space:
    from this process's memo, else from the transform cache, else measured now (in a
    child process, as measure_transforms does for many at once)."""
    key = (tuple(shape), src, dst, opts)
    if key not in _measured:
        measure_transforms([key[:3]], opts)
    return _measured[key]


def measure_transforms(keys: Iterable[tuple[tuple[int, ...], str, str]],
                       opts: MeasureOptions = MeasureOptions()) -> None:
    """Time every (shape, src, dst) transform not known yet, for fastest_transform.

    A layout problem asks for hundreds (ResNet-18: ~130 kernels): built in parallel
    processes, then checked exact and timed one after another in a child process (a
    kernel that crashes is that kernel's inf, never the caller's death), and kept in the
    transform cache (layout/transform_cache.py), so the next compile on this machine
    times none of them again."""
    from raytune_kernels.layout import transform_cache

    todo: dict[tuple, list[Config]] = {}
    for shape, src, dst in dict.fromkeys((tuple(k[0]), k[1], k[2]) for k in keys):
        key = (shape, src, dst, opts)
        if key in _measured:
            continue
        trivial = _trivial(shape, src, dst)
        if trivial is not None:
            _measured[key] = trivial
            continue
        cached = transform_cache.lookup(shape, src, dst, opts)
        if cached is not None:
            _measured[key] = cached
            COUNTS["cached"] += 1
            continue
        todo[(shape, src, dst)] = _few_configs(shape, src, dst)
    if not todo:
        return
    from raytune_kernels.cpu.probe import start_child

    COUNTS["timed"] += len(todo)
    items = [(k, cfg) for k, cfgs in todo.items() for cfg in cfgs]
    child = start_child(_TIME_CHILD)  # its imports run while this process builds
    try:
        libraries = build_transforms([(*k, cfg) for k, cfg in items])
    except BaseException:
        child.kill()
        child.communicate()
        raise
    seconds = time_isolated([(*k, cfg, lib) for (k, cfg), lib in zip(items, libraries)],
                            opts, child)
    best: dict[tuple, tuple[float, Config | None]] = {}
    for ((shape, src, dst), cfg), lib, t in zip(items, libraries, seconds):
        if lib is not None:
            _libraries[(shape, src, dst, cfg)] = lib  # checked in the child: loadable here
        key = (shape, src, dst)
        if key not in best or t < best[key][0]:
            best[key] = (t, cfg)
    for (shape, src, dst), (t, cfg) in best.items():
        _measured[(shape, src, dst, opts)] = (t, cfg if math.isfinite(t) else None)
    transform_cache.store([(k, t, cfg) for k, (t, cfg) in best.items()], opts)


def priced_transform(shape: tuple[int, ...], src: str, dst: str, ghz: float,
                     opts: MeasureOptions = MeasureOptions()) -> tuple[float, Config | None]:
    """(seconds, config) of the transform src -> dst without timing it: its timing where
    this process or this machine's transform cache has one, else the model
    (modeled_seconds) for the config _few_configs picks. An untuned compile prices its
    edges so (its node costs are estimates too); a compile from records times them."""
    key = (tuple(shape), src, dst, opts)
    if key in _measured:
        return _measured[key]
    trivial = _trivial(tuple(shape), src, dst)
    if trivial is not None:
        return trivial
    from raytune_kernels.layout import transform_cache

    cached = transform_cache.lookup(tuple(shape), src, dst, opts)
    if cached is not None:
        _measured[key] = cached
        return cached
    cfg = _few_configs(tuple(shape), src, dst)[0]
    return modeled_seconds(shape, src, dst, ghz), cfg


# A transform's time as a call plus a cost per float by what the copy must do: fitted on
# 847 transforms this code timed at 1 thread with warm caches (NCHW, NHWC and NCHW<x>c
# of ResNet, MobileNet and BERT tensors, 3 to 800K floats, a 4.2 GHz core): median
# error 5.7%, 90th percentile 27%, rank correlation 0.97. Per float, in cycles: a copy
# with channels innermost on both sides moves vectors; one with W innermost on a side
# transposes C with W (4x dearer); NCHW to NCHW only adds or drops a border.
TRANSFORM_CALL_S = 2.0e-6
CYCLES_PER_FLOAT = {"vector": 0.32, "transpose": 1.17, "border": 0.26}


def modeled_seconds(shape: tuple[int, ...], src: str, dst: str, ghz: float) -> float:
    """The model's seconds for a transform between two layouts that can both hold
    `shape` (TRANSFORM_CALL_S plus CYCLES_PER_FLOAT by kind at `ghz`)."""
    a, b = (Layout.parse(x).name for x in (src, dst))
    kind = "border" if a == b == PLAIN else "transpose" if PLAIN in (a, b) else "vector"
    return TRANSFORM_CALL_S + math.prod(shape) * CYCLES_PER_FLOAT[kind] / (ghz * 1e9)


COUNTS = {"timed": 0, "cached": 0}  # transforms this process timed / found in the cache
_measured: dict[tuple, tuple[float, Config | None]] = {}
_libraries: dict[tuple, bytes] = {}  # (shape, src, dst, config) -> library checked exact


def _trivial(shape: tuple[int, ...], src: str, dst: str) -> tuple[float, None] | None:
    """The cost without a kernel: 0 for the same layout, inf for a layout that cannot hold
    the tensor (or blocks that do not nest); None when a kernel must be timed."""
    if src == dst or len(shape) != 4:
        return (0.0 if src == dst else math.inf), None
    try:
        s, d = Layout.parse(src), Layout.parse(dst)
        s.check(shape[1])
        d.check(shape[1])
        blocks(shape[1], s, d)
    except ValueError:
        return math.inf, None
    return None


def _few_configs(shape: tuple[int, ...], src: str = PLAIN, dst: str = PLAIN
                 ) -> list[Config]:
    """One config of the transform's space, by two facts, keeps a network's hundreds of
    edge timings (each a build) to seconds: the parallel loop pays off only on tensors
    past a few L1s, and the tile's width matters only where W is the innermost axis of a
    side (NCHW), which a tile a few columns wide transposes with C. Where channels are
    innermost on both sides (NHWC, NCHW<x>c) each pixel's channels are a contiguous run
    on both: a tile one column wide copies them as vectors, where eight columns made
    LLVM untangle a 64x8 scalar transpose (2 threads, NCHW64c <-> NHWC of
    ResNet-18's tensors: built in 0.14-0.19 s instead of 1.2-1.4 s, and ran 3.1-3.5x
    faster)."""
    space = transform_space(shape, src, dst)
    channels_inner = all(Layout.parse(x).name != PLAIN for x in (src, dst))
    widths = sorted({c["tile_w"] for c in space},
                    key=lambda t: t if channels_inner else (abs(t - 8), -t))
    parallel = math.prod(shape) >= PARALLEL_FLOATS
    return [c for c in space if c["tile_w"] == widths[0] and c["parallel"] == parallel]


def _build_one(shape: tuple[int, ...], src: str, dst: str, cfg: Config) -> bytes | None:
    nest = transform_nest(shape, Layout.parse(src), Layout.parse(dst), cfg)
    built = build(render(nest))
    return None if built.error else built.library


def build_transforms(items: list[tuple[tuple[int, ...], str, str, Config]]
                     ) -> list[bytes | None]:
    """The libraries of (shape, src, dst, config) transform kernels (None: no build), in
    as many child processes as this process has cores when there are enough to pay for
    starting them (plain `python -c` children: multiprocessing's spawn would run the
    user's unguarded script again). Building runs no kernel, so this is for time only."""
    cores = len(os.sched_getaffinity(0))
    workers = min(cores, len(items) // POOL_MIN_ITEMS)
    if workers < 2 or len(items) * BUILD_S * (1 - 1 / workers) < CHILD_START_S:
        return [_build_one(*item) for item in items]
    with tempfile.TemporaryDirectory(prefix="rk_build_transforms_") as tmp:
        paths = [os.path.join(tmp, f"t{i}.so") for i in range(len(items))]
        jobs = [[[list(sh), src, dst, cfg.to_json(), path]
                 for (sh, src, dst, cfg), path in zip(items, paths)][w::workers]
                for w in range(workers)]
        children = []
        for w, job in enumerate(jobs):
            spec = os.path.join(tmp, f"job{w}.json")
            with open(spec, "w") as f:
                json.dump(job, f)
            children.append(subprocess.Popen([sys.executable, "-c", _BUILD_CHILD, spec]))
        for child in children:
            child.wait()
        out = []
        for path, item in zip(paths, items):
            if os.path.exists(path):
                with open(path, "rb") as f:
                    out.append(f.read())
            else:  # not built there (an error, or a child that died): build it here
                out.append(_build_one(*item))
        return out


_BUILD_CHILD = """
import json, sys
from raytune_kernels.layout.costs import build_to_files
build_to_files(json.load(open(sys.argv[1])))
"""


def build_to_files(job: list) -> None:
    """A build child's work: each [shape, src, dst, config, path] built into path."""
    for shape, src, dst, cfg, path in job:
        library = _build_one(tuple(shape), src, dst, Config.from_json(cfg))
        if library is not None:
            with open(path, "wb") as f:
                f.write(library)


POOL_MIN_ITEMS = 8  # transforms per build child, at least
# Build children pay for themselves only when they save more than their start (torch and
# this package imported): on 2 cores, a ResNet-18 transform built in 45 ms on average
# and a child started in ~4 s, so ResNet-18's ~110 transforms build faster here,
# beside the timing child's start (measure_transforms).
BUILD_S, CHILD_START_S = 0.045, 4.0


def time_isolated(items: list[tuple[tuple[int, ...], str, str, Config, bytes | None]],
                  opts: MeasureOptions, child=None) -> list[float]:
    """Seconds of each built transform, checked exact and timed in a child process one
    after another (`child`, from probe.start_child(_TIME_CHILD), when given; inf: no
    build, a wrong result, or it killed the child, which is then replaced for the
    rest)."""
    from raytune_kernels.cpu.probe import run_jobs

    out = [math.inf] * len(items)
    todo = [i for i, it in enumerate(items) if it[4] is not None]
    jobs = [{"shape": list(items[i][0]), "src": items[i][1], "dst": items[i][2],
             "config": items[i][3].to_json()} for i in todo]
    results = run_jobs(_TIME_CHILD, jobs, [items[i][4] for i in todo],
                       {"opts": dataclasses.asdict(opts)}, child)
    for i, (value, _) in zip(todo, results):  # an error (a crash) stays inf
        if isinstance(value, (int, float)):
            out[i] = float(value)
    return out


_TIME_CHILD = "raytune_kernels.layout.costs:time_in_child"


def time_in_child(job: dict, library: bytes, common: dict) -> float:
    """One transform timed where it may crash (run_jobs' child process)."""
    import torch
    opts = MeasureOptions(**common["opts"])
    shape = tuple(job["shape"])
    src, dst = Layout.parse(job["src"]), Layout.parse(job["dst"])
    cfg = Config.from_json(job["config"])
    nest = transform_nest(shape, src, dst, cfg)
    kernel = LoadedKernel(library, nest.name, 2)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(opts.seed))
    return _time_one(shape, src, dst, kernel, x, opts)


@functools.lru_cache(maxsize=4096)
def transform_kernel(shape: tuple[int, ...], src: Layout, dst: Layout, cfg: Config
                     ) -> LoadedKernel | None:
    """The loaded transform kernel (None when it does not build); cached, so the kernel
    timed for the layout problem is the one a compiled network calls. Its library comes
    from measure_transforms when this process timed it (checked exact in a child)."""
    nest = transform_nest(shape, src, dst, cfg)
    text = render(nest)
    library = _libraries.get((tuple(shape), src.label, dst.label, cfg))
    if library is None:
        built = build(text, persist=True)
        if built.error:
            return None
        library = built.library
    else:  # built by a child: the next compile loads it from disk like the others
        keep(text, None, library)
    return LoadedKernel(library, nest.name, 2)


_ARENA: list[np.ndarray] = []  # the memory of the cold destinations, kept by the process


def _cold_destinations(out: np.ndarray, n: int) -> list[np.ndarray]:
    """`n` - 1 more destinations of `out`'s size, 64-byte aligned, carved from one buffer
    that this process keeps and touched once: allocating and touching twice the
    last-level cache anew for every transform was half of its timing's time."""
    step = -(-out.size // 16) * 16  # 16 floats: 64 bytes
    need = step * (n - 1)
    if not _ARENA or _ARENA[0].size < need:
        _ARENA[:] = [aligned(np.zeros(need, np.float32))]
    return [_ARENA[0][i * step: i * step + out.size] for i in range(n - 1)]


def _time_one(shape, src: Layout, dst: Layout, kernel: LoadedKernel, x: torch.Tensor,
              opts) -> float:
    import torch
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
    outs = [out] + _cold_destinations(out, cold_copies(out.nbytes))
    ptrs = [(inp.ctypes.data, o.ctypes.data) for o in outs]
    turn = [0]

    def run() -> None:
        turn[0] = (turn[0] + 1) % len(ptrs)
        kernel(list(ptrs[turn[0]]), opts.threads)
    return median(time_fn(run, opts.timing()))
