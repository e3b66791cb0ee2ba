"""build_all: the same libraries as one build() after another, whoever builds them."""
import random

import pytest

from raytune_kernels.cpu import build as build_mod
from raytune_kernels.cpu.build import build, is_built
from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu import parallel_build
from raytune_kernels.cpu.parallel_build import build_all
from raytune_kernels.cpu.schedules import lower, space_for
from raytune_kernels.cpu.probe import PROBE  # a small dense task


def texts(n: int, seed: int) -> list[str]:
    space, rng = space_for(PROBE, cpu_info()), random.Random(seed)
    out = []
    while len(out) < n:
        text = render(lower(PROBE, space.sample(rng)))
        if text not in out:
            out.append(text)
    return out


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYTUNE_KERNELS_CACHE", str(tmp_path))
    monkeypatch.setattr(build_mod, "_built", type(build_mod._built)())
    return tmp_path


def test_children_build_the_bytes_a_serial_build_makes(empty_cache, monkeypatch):
    kernels = texts(6, seed=1)
    serial = [build(t).library for t in kernels]
    monkeypatch.setattr(build_mod, "_built", type(build_mod._built)())
    # every kernel is worth a child, there are two besides this process, and this one
    # claims none: the children build them all
    monkeypatch.setattr(parallel_build, "CHILD_START_S", 1e-9)
    monkeypatch.setattr(parallel_build, "_claim", lambda d, i: False)
    got = build_all(kernels + kernels[:2], persist=True, workers=3)
    assert [r.library for r in got] == serial + serial[:2]
    assert all(r.error is None for r in got)
    assert all(is_built(t, None, persist=True) for t in kernels)
    assert len(list((empty_cache / "libraries").iterdir())) == len(kernels)


def test_a_kernel_that_fails_is_its_error_alone(empty_cache, monkeypatch):
    monkeypatch.setattr(parallel_build, "CHILD_START_S", 1e-9)
    kernels = texts(3, seed=2)
    got = build_all([kernels[0], "this is not LLVM IR", *kernels[1:]], workers=2)
    assert [r.library is not None for r in got] == [True, False, True, True]
    assert "error" in got[1].error.lower()


def test_a_library_built_unpersisted_reaches_the_disk_when_persisted_later(empty_cache):
    text = texts(1, seed=3)[0]
    build(text)
    assert not (empty_cache / "libraries").exists()
    build(text, persist=True)
    assert len(list((empty_cache / "libraries").iterdir())) == 1
