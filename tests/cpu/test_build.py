import collections
import os
import random

import numpy as np
import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu.build import BUILD_PHASES, build, LoadedKernel
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.cpu.schedules import space_for
from raytune_kernels.space import Config
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.llvm.ir import render
from tests.cpu.test_loopnest import matmul_nest


def test_bad_ir_is_a_build_error_as_data():
    result = build("define void @f( {")
    assert result.library is None and "error" in result.error.lower()


def test_built_library_loads_from_bytes_and_runs():
    nest = matmul_nest()
    result = build(render(nest))
    assert result.error is None and result.library[:4] == b"\x7fELF"
    rng = np.random.default_rng(0)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((4, 6), (6, 16), (16,)))
    out = np.zeros((4, 16), np.float32)
    kernel = LoadedKernel(result.library, nest.name, 4)
    kernel([x.ctypes.data for x in (a, b, bias, out)], 2)
    np.testing.assert_allclose(out, np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-5)


def test_cpu_info_knows_named_cpus():
    assert cpu_info("haswell").lanes == (8,) and cpu_info("haswell").regs == 16
    assert cpu_info("znver4").lanes == (16, 8)
    assert cpu_info().lanes[-1] == 8


def test_one_openmp_runtime_beside_torch():
    """torch bundles a libgomp with the system's SONAME: after our kernels load there must
    still be a single OpenMP runtime mapped in the process."""
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent("""
        import torch
        import numpy as np
        from raytune_kernels.cpu.build import LoadedKernel, build
        from raytune_kernels.cpu.llvm.ir import render
        from tests.cpu.test_loopnest import matmul_nest
        nest = matmul_nest()
        k = LoadedKernel(build(render(nest)).library, nest.name, 4)
        bufs = [np.ones(64, np.float32) for _ in range(4)]
        k([b.ctypes.data for b in bufs], 2)
        torch.ones(1000, 1000) @ torch.ones(1000, 1000)
        maps = open("/proc/self/maps").read().splitlines()
        print(len({line.split()[-1] for line in maps if "libgomp" in line}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


def test_host_faults_are_told_from_candidate_faults(monkeypatch):
    """A full or read-only temp dir is the machine's fault (retried, never blamed on the
    candidate); a link that fails with space left is the candidate's."""
    import errno
    import os

    from raytune_kernels.cpu import build as build_mod

    assert "No space left on device" in build_mod.host_fault(OSError(errno.ENOSPC, "x"))
    assert "Read-only file system" in build_mod.host_fault(OSError(errno.EROFS, "x"))
    assert build_mod.host_fault(RuntimeError("link failed: undefined symbol")) is None
    full = os.statvfs_result((4096, 4096, 100, 0, 0, 0, 0, 0, 0, 255))
    monkeypatch.setattr(build_mod.os, "statvfs", lambda path: full)
    assert "is full (0 bytes free)" in build_mod.host_fault(RuntimeError("link failed: "))
    result = build_mod.build("define void @f() {\n  ret void\n}\n")
    assert result.error is None  # a build that succeeds never asks


def test_a_build_times_its_phases_and_a_cached_build_has_none(monkeypatch):
    """optimize, codegen and link add up to the build's seconds; the library cache's hit
    did none of that work again, so it reports none of that time."""
    from raytune_kernels.cpu import build as build_mod

    monkeypatch.setattr(build_mod, "_built", collections.OrderedDict())
    text = render(matmul_nest())
    fresh = build(text)
    assert fresh.error is None
    assert [name for name, _ in fresh.phases] == ["optimize", "codegen", "link"]
    assert all(s > 0 for _, s in fresh.phases)
    assert sum(s for _, s in fresh.phases) == pytest.approx(fresh.seconds, rel=0.05, abs=1e-3)
    cached = build(text)
    assert cached.library == fresh.library and cached.phases == ()
    assert cached.seconds < min(s for _, s in fresh.phases)


def test_build_for_times_rendering_first_also_when_lowering_fails(monkeypatch):
    from raytune_kernels.cpu import build as build_mod

    monkeypatch.setattr(build_mod, "_built", collections.OrderedDict())
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
    compute = rk.extract_tasks(model, (torch.randn(4, 64),))[0].compute
    cfg = space_for(compute, cpu_info()).sample(random.Random(0))
    built = build_for(compute, cfg)
    assert built.error is None and [name for name, _ in built.phases] == list(BUILD_PHASES)
    assert sum(s for _, s in built.phases) == pytest.approx(built.seconds, rel=0.05, abs=1e-3)
    again = build_for(compute, cfg)  # rendered again, built from the cache
    assert [name for name, _ in again.phases] == ["render"]
    assert again.seconds == pytest.approx(again.phases[0][1], rel=0.05, abs=1e-3)
    bad = build_for(compute, Config.of(lanes=16, ob=16))
    assert bad.library is None and bad.phases == (("render", bad.seconds),)


def test_persisted_libraries_are_loaded_by_the_next_process_not_built(tmp_path, monkeypatch):
    """compile_network's builds go to disk; a later process building the same IR for the
    same CPU loads the file (no LLVM), a damaged file is built again, another host's
    features or an empty cache setting never share one."""
    from raytune_kernels.cache import CACHE_ENV
    from raytune_kernels.cpu import build as build_mod

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(build_mod, "_built", build_mod.collections.OrderedDict())
    ir = "define void @persisted_f() {\n  ret void\n}\n"
    first = build_mod.build(ir, persist=True)
    files = list((tmp_path / "libraries").glob("*.so"))
    assert first.error is None and len(files) == 1
    assert files[0].read_bytes() == first.library
    build_mod._built.clear()  # a new process: nothing in memory
    real_compile = build_mod.compile_object
    monkeypatch.setattr(build_mod, "compile_object", pytest.fail)
    again = build_mod.build(ir, persist=True)
    assert again.library == first.library and again.phases == ()
    build_mod._built.clear()
    files[0].write_bytes(b"not a library")
    monkeypatch.setattr(build_mod, "compile_object", real_compile)
    assert build_mod.build(ir, persist=True).library == first.library  # rebuilt
    name, features = build_mod.host_cpu()
    monkeypatch.setattr(build_mod, "host_cpu", lambda: (name, features + ",-avx2"))
    assert build_mod._disk_path(next(iter(build_mod._built))) != files[0]
    monkeypatch.setenv(CACHE_ENV, "")
    assert build_mod._disk_path(next(iter(build_mod._built))) is None


@pytest.mark.parametrize("fault_small", [False, True])
@pytest.mark.parametrize("n", [5, 1 << 19, (3 << 20) + 7])
def test_aligned_copies_start_on_a_cache_line_and_large_ones_on_a_huge_page(n, fault_small):
    from raytune_kernels.cpu.build import ALIGN, HUGE, aligned
    flat = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = aligned(flat, fault_small=fault_small)
    assert out.size == n and out.dtype == np.float32 and np.array_equal(out, flat)
    assert out.ctypes.data % (HUGE if n * 4 >= HUGE else ALIGN) == 0
    view = torch.from_numpy(out)  # compiled networks view their buffers as tensors
    view += 1.0
    assert np.array_equal(out, flat + 1.0)


def test_a_copy_faulted_in_small_pages_is_advised_for_huge_ones_after():
    """Its mapping is eligible for huge pages, though the copy itself touched none; and
    where the kernel can collapse a range at once (Linux 6.1+), it is huge pages now, not
    whenever khugepaged comes by (a network compiled a moment ago ran ResNet-18 1.18x
    slower on the small pages)."""
    import mmap
    import re

    from raytune_kernels.cpu.build import HUGE, MADV_COLLAPSE, aligned
    if not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        pytest.skip("no transparent huge pages here")
    out = aligned(np.ones(3 << 20, np.float32), fault_small=True)
    start = out.ctypes.data
    maps = re.findall(r"^([0-9a-f]+)-([0-9a-f]+) .*?\nAnonHugePages:\s+(\d+) kB.*?"
                      r"\nTHPeligible:\s+(\d)", open("/proc/self/smaps").read(), re.M | re.S)
    mine = [(int(huge), e) for lo, hi, huge, e in maps if int(lo, 16) <= start < int(hi, 16)]
    assert [e for _, e in mine] == ["1"]
    probe = mmap.mmap(-1, 2 * HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    probe.madvise(mmap.MADV_HUGEPAGE)
    probe.write(b"\1" * (2 * HUGE))
    try:  # whether this kernel collapses at all
        probe.madvise(MADV_COLLAPSE)
    except OSError:
        pytest.skip("this kernel does not collapse ranges into huge pages at once")
    assert mine[0][0] * 1024 >= 5 * HUGE  # of its 12 MiB, the whole huge pages inside


def test_libraries_link_with_ld_itself_or_with_cc_where_ld_is_missing(monkeypatch):
    """Both ways give a library that loads libgomp and runs the kernel."""
    import shutil

    from raytune_kernels.cpu import build as B
    nest = matmul_nest()
    obj = B.compile_object(render(nest))
    assert B.linker()[0] == shutil.which("ld")
    kinds = [B.linker()]
    B.linker.cache_clear()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    try:
        kinds.append(B.linker())
        assert kinds[1] == ("cc", "-shared")
        libs = [B.link_shared(obj)]
    finally:
        B.linker.cache_clear()
    monkeypatch.undo()
    libs.append(B.link_shared(obj))
    B.linker.cache_clear()
    monkeypatch.setattr(B, "_links", lambda command: False)  # ld that cannot find libm
    try:
        assert B.linker() == ("cc", "-shared")
    finally:
        B.linker.cache_clear()
    for lib in libs:
        assert b"libgomp.so" in lib
        LoadedKernel(lib, nest.name, len(nest.buffers))
