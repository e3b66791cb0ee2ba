"""Measured layout-transform costs, kept per machine between compiles.

A layout problem prices hundreds of transforms; timing them was most of a compile (64 of
71 s for ResNet-18). They depend on the machine, the threads, the timing protocol and the
code that generates the kernels, never on the model: one JSON line per (shape, src, dst)
in `<cache dir>/transforms.jsonl`, keyed by all of those, makes every later compile on
this machine look them up instead (raytune_kernels/cache.py says where; an empty
RAYTUNE_KERNELS_CACHE turns it off). Lines that do not parse are ignored (a cache, not a record).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib

from raytune_kernels.cache import (CACHE_ENV, cache_dir,  # noqa: F401  (CACHE_ENV re-exported)
                                   code_fingerprint)
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.space import Config

# the code a transform kernel comes from: a change to any of them is a new kernel
GENERATOR = ("cpu/transform.py", "cpu/llvm/ir.py", "cpu/llvm/row_statements.py", "cpu/loopnest.py",
             "cpu/build.py", "layout/costs.py")


@functools.cache
def fingerprint() -> str:
    """The machine and the kernel generator: CPU name and ISA, llvmlite, our sources."""
    import llvmlite

    from raytune_kernels.cpu.machine import host_device

    return code_fingerprint([*host_device(), llvmlite.__version__], GENERATOR)


def _key(shape, src: str, dst: str, opts: MeasureOptions) -> str:
    return json.dumps([fingerprint(), dataclasses.astuple(opts), list(shape), src, dst])


def _path() -> pathlib.Path | None:
    d = cache_dir()
    return None if d is None else d / "transforms.jsonl"


def _entries() -> dict[str, tuple[float, Config | None]]:
    path = _path()
    if path is None:
        return {}
    mtime = path.stat().st_mtime_ns if path.exists() else None
    if "entries" not in _loaded or _loaded["mtime"] != (path, mtime):
        entries = {}
        if mtime is not None:
            with open(path, errors="replace") as f:
                for line in f:
                    try:
                        d = json.loads(line)
                        cfg = None if d["config"] is None else Config.from_json(d["config"])
                        entries[d["key"]] = (float(d["seconds"]), cfg)
                    except (ValueError, KeyError, TypeError):
                        continue
        _loaded.update(mtime=(path, mtime), entries=entries)
    return _loaded["entries"]


_loaded: dict = {}


def lookup(shape, src: str, dst: str, opts: MeasureOptions
           ) -> tuple[float, Config | None] | None:
    return _entries().get(_key(shape, src, dst, opts))


def store(results: list[tuple[tuple, float, Config | None]], opts: MeasureOptions) -> None:
    """Append (shape, src, dst), seconds, config measured now; a cache that cannot be
    written (read-only home) is skipped: it only saves time."""
    path = _path()
    if path is None or not results:
        return
    lines = "".join(json.dumps({"key": _key(*k, opts), "seconds": t if math.isfinite(t)
                                else "inf", "config": None if c is None else c.to_json()})
                    + "\n" for k, t, c in results)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:  # one write of whole lines (O_APPEND)
            f.write(lines)
    except OSError:
        return
