"""-mcpu checks before any work: a CPU LLVM does not know, and one this host cannot run."""
import random
import warnings

from raytune_kernels.cpu import probe
from raytune_kernels.cpu.build import build, host_cpu
from raytune_kernels.cpu.faults import fault_library
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.schedules import space_for


def test_cpus_this_host_runs_pass_the_probe():
    assert probe.unusable_mcpu(None) is None and probe.unusable_mcpu(host_cpu()[0]) is None
    probe.host_cannot_run.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the probe ran: no "could not run" warning
        assert probe.unusable_mcpu("x86-64") is None  # the baseline every x86-64 host runs
    built = probe.probe_libraries("x86-64")
    assert 1 <= len(built) <= probe.PROBE_CONFIGS


def test_an_unknown_cpu_is_named():
    assert "-mcpu=notacpu is not a CPU LLVM knows" in probe.unusable_mcpu("notacpu")


def _trap_library(cfg):
    """Stands in for code using an instruction the host lacks (SIGILL)."""
    trap = fault_library(probe.PROBE, cfg, "illegal")
    assert trap.error is None, trap.error
    return trap


def test_isolated_checks_blame_only_the_kernel_that_kills_the_child(monkeypatch):
    from raytune_kernels.cpu import parallel_build
    from raytune_kernels.cpu.llvm.ir import render
    from raytune_kernels.cpu.schedules import lower

    space, rng = space_for(probe.PROBE, cpu_info()), random.Random(1)
    cfgs = list(dict.fromkeys(space.sample(rng) for _ in range(8)))[:4]
    trap_text, trap = render(lower(probe.PROBE, cfgs[1])), _trap_library(cfgs[1])
    real = parallel_build.build_all
    monkeypatch.setattr(parallel_build, "build_all", lambda texts, *a, **k: [
        trap if t == trap_text else r for t, r in zip(texts, real(texts, *a, **k))])
    verdicts = probe.check_isolated([(probe.PROBE, c) for c in cfgs])
    assert verdicts[0] is None and verdicts[2] is None and verdicts[3] is None
    assert verdicts[1] == "crashed: killed its process by SIGILL"


def test_code_the_host_cannot_execute_is_refused_naming_sigill(monkeypatch):
    """Stands in for AVX-512 code on an AVX2 host: the probe kernel executes ud2
    (llvm.trap), which the CPU answers with SIGILL, as it does an instruction it lacks."""
    cfg = space_for(probe.PROBE, cpu_info()).sample(random.Random(0))
    trap = _trap_library(cfg)
    monkeypatch.setattr(probe, "probe_libraries", lambda mcpu: [(cfg, trap.library)])
    probe.host_cannot_run.cache_clear()
    try:
        problem = probe.unusable_mcpu("haswell" if host_cpu()[0] != "haswell" else "znver3")
    finally:
        probe.host_cannot_run.cache_clear()
    assert problem is not None and "dies with SIGILL (illegal instruction) on this host" in \
        problem and f"use -mcpu={host_cpu()[0]}" in problem


def test_load_directories_of_dead_processes_are_swept(tmp_path, monkeypatch):
    """A measurer killed by its candidate (SIGSEGV) cleans nothing up: the next one sweeps
    what dead processes left, and leaves live processes' directories alone."""
    import os
    import subprocess
    import sys
    import tempfile

    from raytune_kernels.cpu.build import LoadedKernel, sweep_stale_dirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = ("import os, tempfile, sys; tempfile.tempdir = sys.argv[1]; "
            "from raytune_kernels.cpu.build import LoadedKernel, build; "
            "lib = build('define void @f(i32 %n) {\\nentry:\\n  ret void\\n}\\n').library; "
            "k = LoadedKernel(lib, 'f', 0); os.kill(os.getpid(), 9)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)])
    dead = [p.name for p in tmp_path.iterdir() if p.name.startswith("rk_load_")]
    assert len(dead) == 1  # left behind by the killed process
    build_ok = build("define void @f(i32 %n) {\nentry:\n  ret void\n}\n")
    mine = LoadedKernel(build_ok.library, "f", 0)
    assert sweep_stale_dirs() == 1
    left = [p.name for p in tmp_path.iterdir()]
    assert dead[0] not in left and os.path.basename(mine._dir.name) in left
