"""Faulty kernels for chaos runs and tests: a library exporting the kernel a candidate's
measurer expects, doing something else (segfault, hang, NaN, nothing, an illegal
instruction). `CHAOS_ENV`, when
set in the environment of Ray's workers (bench/chaos.py sets it), makes builders hand out
such a library instead of the real one with the given probabilities, and log each one:

    RAYTUNE_KERNELS_CHAOS="segfault=0.03,hang=0.005,nan=0.03,wrong=0.03,log=/tmp/faults"

or, for a deterministic schedule, `every=N`: every Nth build of a builder process is the
next of the listed kinds in turn (their numbers are then ignored). Unset (always, outside
chaos runs) nothing changes.
"""
from __future__ import annotations

import json
import os
import random

from raytune_kernels.cpu.build import BuildResult, build
from raytune_kernels.space import Config
from raytune_kernels.task import Compute

CHAOS_ENV = "RAYTUNE_KERNELS_CHAOS"
KINDS = ("segfault", "hang", "nan", "wrong", "illegal")


def fault_library(compute: Compute, cfg: Config, kind: str) -> BuildResult:
    """A library exporting the candidate's kernel symbol that does `kind` instead."""
    from raytune_kernels.cpu.schedules import lower

    nest = lower(compute, cfg)
    names = [b.name for b in nest.buffers]
    args = ", ".join(f"ptr %b{i}" for i in range(len(names)))
    out = f"%b{names.index('out')}"
    bodies = {
        "segfault": "store volatile float 1.0, ptr inttoptr (i64 8 to ptr)\n  ret void",
        "hang": "br label %spin\nspin:\n  %x = load volatile float, ptr %b0\n  br label %spin",
        "wrong": "ret void",  # writes nothing: the output keeps its poison
        "nan": f"store float 0x7FF8000000000000, ptr {out}\n  ret void",
        # ud2: the CPU answers SIGILL, as it does an instruction it lacks
        "illegal": "call void @llvm.trap()\n  unreachable",
    }
    if kind not in bodies:
        raise ValueError(f"unknown fault kind {kind!r}: one of {', '.join(KINDS)}")
    return build(f'declare void @llvm.trap()\ndefine void @"{nest.name}"({args}, i32 %n) {{\n'
                 f'entry:\n  {bodies[kind]}\n}}\n')


def parse_chaos(text: str) -> tuple[dict[str, float], str | None, int]:
    """'segfault=0.03,...,log=PATH[,every=N]' -> ({kind: probability}, log path, N or 0)."""
    rates, log, every = {}, None, 0
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name == "log":
            log = value
        elif name == "every":
            every = int(value)
        elif name in KINDS:
            rates[name] = float(value)
        else:
            raise ValueError(f"{CHAOS_ENV}: unknown entry {part!r}")
    return rates, log, every


def maybe_inject(compute: Compute, cfg: Config, built: BuildResult,
                 rng: random.Random = random.Random()) -> BuildResult:
    """`built`, or under CHAOS_ENV now and then a fault library in its place (logged)."""
    text = os.environ.get(CHAOS_ENV)
    if not text or built.library is None:
        return built
    rates, log, every = parse_chaos(text)
    kind = None
    if every:
        _builds[0] += 1
        if _builds[0] % every == 0 and rates:
            kinds = list(rates)
            kind = kinds[(_builds[0] // every - 1) % len(kinds)]
    else:
        draw, edge = rng.random(), 0.0
        for name, rate in rates.items():
            edge += rate
            if draw < edge:
                kind = name
                break
    if kind is None:
        return built
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"kind": kind, "config": cfg.to_json()}) + "\n")
    return fault_library(compute, cfg, kind)


_builds = [0]  # builds seen by this process (for every=N)
