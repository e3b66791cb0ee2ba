"""Many kernels built at once: build_all() shares the IR texts that no cache holds between
this process and child processes, one per further core.

llvmlite serialises every call into LLVM behind one lock per process (and cpu/build.py
holds its own around a build), so threads build one kernel at a time: parallel builds
need processes. A child imports this module's package without torch (about 0.3 s), so it
pays for itself from a few kernels on. Work is shared by claims, not a fixed split: every
builder (this process included) walks the list and takes the next kernel nobody has
claimed (a file created exclusively), so a slow kernel delays one builder only. A child
writes each library (or its error) to a file; what a child claimed and left unfinished
(it died) is built here. The libraries are the bytes build() makes, kept by content like
its own (in memory, and on disk with `persist`).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Sequence

from raytune_kernels.cpu import build as _build
from raytune_kernels.cpu.build import BuildResult

# one kernel's build (LLVM and the link) against a child's start, both measured on 2
# cores: a ResNet-50 conv kernel 20-40 ms, a child ready to build in ~0.3 s
BUILD_S, CHILD_START_S = 0.03, 0.3

_CHILD = """
import sys
from raytune_kernels.cpu.parallel_build import build_claimed
build_claimed(sys.argv[1], int(sys.argv[2]), sys.argv[3] or None)
"""


def build_all(texts: Sequence[str], mcpu: str | None = None, persist: bool = False,
              workers: int | None = None) -> list[BuildResult]:
    """build(text, mcpu, persist) of every text, in order, the uncached ones built by up
    to `workers` processes (this one and children; default: this process's cores) when
    there are enough of them to pay for starting a child. Failures come back as data, as
    build()'s do."""
    unique = list(dict.fromkeys(texts))
    todo = [t for t in unique if not _build.is_built(t, mcpu, persist)]
    workers = workers or len(os.sched_getaffinity(0))
    children = min(workers - 1, int(len(todo) * BUILD_S // CHILD_START_S))
    if children >= 1 and len(todo) >= 2:
        _build_with_children(todo, mcpu, persist, children)
    done = {t: _build.build(t, mcpu, persist) for t in unique}
    return [done[t] for t in texts]


def _build_with_children(todo: list[str], mcpu: str | None, persist: bool,
                         children: int) -> None:
    """Build `todo` here and in `children` child processes; every library ends up in
    build()'s cache (a failed one is built again by the caller's build(), which returns
    its error)."""
    with tempfile.TemporaryDirectory(prefix=f"rk_build_{os.getpid()}_") as d:
        for i, text in enumerate(todo):
            with open(os.path.join(d, f"k{i}.ll"), "w") as f:
                f.write(text)
        procs = [subprocess.Popen([sys.executable, "-c", _CHILD, d, str(len(todo)),
                                   mcpu or ""], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for _ in range(children)]
        mine = []
        try:
            for i in range(len(todo)):
                if _claim(d, i):
                    mine.append(i)
                    _build.build(todo[i], mcpu, persist)
        finally:
            for p in procs:
                p.wait()
        for i, text in enumerate(todo):
            path = os.path.join(d, f"k{i}.so")
            if i not in mine and os.path.exists(path):
                with open(path, "rb") as f:
                    _build.keep(text, mcpu, f.read(), persist)


def _claim(d: str, i: int) -> bool:
    """Whether this builder takes kernel i (no other has)."""
    try:
        os.close(os.open(os.path.join(d, f"k{i}.claim"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def build_claimed(d: str, n: int, mcpu: str | None) -> None:
    """A build child's work: every kernel k<i>.ll of directory `d` not yet claimed, built
    into k<i>.so (whole, by a rename; nothing where it fails: the caller builds it again
    and gets the error)."""
    for i in range(n):
        if not _claim(d, i):
            continue
        with open(os.path.join(d, f"k{i}.ll")) as f:
            text = f.read()
        result = _build.build(text, mcpu)
        if result.library is not None:
            tmp = os.path.join(d, f"k{i}.so.tmp")
            with open(tmp, "wb") as f:
                f.write(result.library)
            os.replace(tmp, os.path.join(d, f"k{i}.so"))
