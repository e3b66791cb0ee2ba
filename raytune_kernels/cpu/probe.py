"""Whether code built for a named CPU (`llvm -mcpu=X`) runs on this host, asked before any
work: a CPU LLVM knows but the host cannot execute (AVX-512 code on an AVX2 host) made
every candidate die with SIGILL, recorded as a crash, trial after trial.

The probe builds a few kernels of a small dense task for X at its widest vectors, where
the instructions a host may lack appear, and runs them in a child process: a child killed
by SIGILL means the host lacks them. Cached per CPU name for the life of the process.
"""
from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import warnings

from raytune_kernels.cpu.build import host_cpu, mcpu_problem
from raytune_kernels.task import Compute, EpilogueOp, TensorSpec

# a Linear(64, 48) + ReLU at batch 1, as capture makes it
PROBE = Compute("dense", (TensorSpec((1, 64)), TensorSpec((48, 64))), TensorSpec((1, 48)), (),
                (EpilogueOp("bias", (TensorSpec((48,)),), axis=1), EpilogueOp("relu")))
PROBE_CONFIGS = 3
_RUN = """
import json, sys
from raytune_kernels.measure import MeasureOptions, measure_built
from raytune_kernels.space import Config
from raytune_kernels.task import Compute
job = json.load(open(sys.argv[1]))
opts = MeasureOptions(warmup=0, min_repeat_ms=0, repeats=1)
for path, cfg in job["built"]:
    measure_built(Compute.from_json(job["compute"]), Config.from_json(cfg),
                  open(path, "rb").read(), opts)
print("probe ran")
"""


def unusable_mcpu(mcpu: str | None) -> str | None:
    """Why `-mcpu=mcpu` cannot be used on this host: a name LLVM does not know, or code
    built for it that this host cannot run. None when it can (or when none is given)."""
    return mcpu_problem(mcpu) or (None if not mcpu or mcpu == host_cpu()[0]
                                  else host_cannot_run(mcpu))


@functools.cache
def host_cannot_run(mcpu: str) -> str | None:
    built = probe_libraries(mcpu)
    if not built:
        return None
    with tempfile.TemporaryDirectory(prefix="rk_probe_") as tmp:
        paths = []
        for i, (_, library) in enumerate(built):
            paths.append(os.path.join(tmp, f"probe{i}.so"))
            with open(paths[-1], "wb") as f:
                f.write(library)
        job = os.path.join(tmp, "job.json")
        with open(job, "w") as f:
            json.dump({"compute": PROBE.to_json(),
                       "built": [[p, cfg.to_json()] for p, (cfg, _) in zip(paths, built)]}, f)
        try:
            child = subprocess.run([sys.executable, "-c", _RUN, job], capture_output=True,
                                   timeout=120)
        except subprocess.TimeoutExpired:
            warnings.warn(f"the -mcpu={mcpu} probe ran past 120 s; going on without it",
                          stacklevel=3)
            return None
    if child.returncode == 0 and b"probe ran" in child.stdout:
        return None
    if child.returncode != -signal.SIGILL:  # not an instruction the host lacks: say so
        last = (child.stderr.decode(errors="replace").strip().splitlines() or ["no output"])
        warnings.warn(f"the -mcpu={mcpu} probe could not run (exit status "
                      f"{child.returncode}: {last[-1]}); going on without it", stacklevel=3)
        return None
    from raytune_kernels.cpu.machine import host_isa

    host = host_cpu()[0]
    return (f"-mcpu={mcpu}: code built for it dies with SIGILL (illegal instruction) on "
            f"this host, {host} ({host_isa() or 'no vector ISA'}): the host lacks "
            f"instructions {mcpu} has; use -mcpu={host}, or a CPU this host can run")


def probe_libraries(mcpu: str) -> list:
    """(config, library) of a few PROBE kernels at the widest vectors of `mcpu`'s space."""
    from raytune_kernels.cpu.kernel import build_for
    from raytune_kernels.cpu.machine import cpu_info
    from raytune_kernels.cpu.schedules import space_for

    cpu = cpu_info(mcpu)
    space, rng = space_for(PROBE, cpu), random.Random(0)
    sampled = [space.sample(rng) for _ in range(64)]
    widest = [c for c in sampled if c.get("lanes") == max(cpu.lanes)] or sampled
    out = []
    for cfg in list(dict.fromkeys(widest))[:PROBE_CONFIGS]:
        result = build_for(PROBE, cfg, mcpu)
        if result.library is not None:
            out.append((cfg, result.library))
    return out
