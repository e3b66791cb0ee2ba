"""Running our kernels in a child process, never in the caller's, where one might crash:

- `unusable_mcpu`: whether code built for a named CPU (`llvm -mcpu=X`) runs on this host,
  asked before any work. A CPU LLVM knows but the host cannot execute (AVX-512 code on an
  AVX2 host) made every candidate die with SIGILL, recorded as a crash, trial after trial.
  A few kernels of a small dense task, built for X at its widest vectors (where the
  instructions a host may lack appear), run in a child: SIGILL means the host lacks them.
- `check_isolated`: kernels that no measurer has checked (an untuned task's configs in
  compile_network) checked against their references in a child before the caller's
  process runs them. A kernel that kills the child is that kernel's failure alone.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import warnings

from raytune_kernels.cpu.build import host_cpu, mcpu_problem
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.space import Config
from raytune_kernels.task import Compute, EpilogueOp, TensorSpec

# a Linear(64, 48) + ReLU at batch 1, as capture makes it
PROBE = Compute("dense", (TensorSpec((1, 64)), TensorSpec((48, 64))), TensorSpec((1, 48)), (),
                (EpilogueOp("bias", (TensorSpec((48,)),), axis=1), EpilogueOp("relu")))
PROBE_CONFIGS = 3
CHILD_TIMEOUT_S = 300.0
_CHILD = """
import importlib, json, sys
module, _, name = sys.argv[1].partition(":")
mod = importlib.import_module(module)
for heavy in getattr(mod, "CHILD_PRELOAD", ()):  # imported before the job comes
    importlib.import_module(heavy)
fn = getattr(mod, name)
job = json.load(open(sys.argv[2] if len(sys.argv) > 2 else sys.stdin.readline().strip()))
for item, path in zip(job["jobs"], job["paths"]):
    print(json.dumps({"started": path}), flush=True)
    try:
        out = {"value": fn(item, open(path, "rb").read(), job["common"])}
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({"done": path, **out}), flush=True)
"""


def start_child(target: str) -> subprocess.Popen:
    """A child for run_jobs(target, ..., child=), started now: it imports `target`'s
    module and what that module lists in CHILD_PRELOAD (torch and this package: ~4 s of
    CPU on 2 cores) while the caller builds what it will run, and then waits for its job
    on stdin."""
    return subprocess.Popen([sys.executable, "-c", _CHILD, target], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run_jobs(target: str, jobs: list[dict], libraries: list[bytes], common: dict,
             child: subprocess.Popen | None = None) -> list[tuple[object, str | None]]:
    """`target` ("module:function", called as function(job, library, common)) on each
    job and its library, in order, in a child process (`child`, from start_child(target),
    when given): (its value, None), or (None, why not) where it raised or killed the
    child. A job that kills the child is blamed alone; the rest go on in a fresh one."""
    results: list[tuple[object, str | None]] = [(None, None)] * len(jobs)
    todo = list(range(len(jobs)))
    if not todo and child is not None:
        child.kill()
        child.communicate()
    while todo:
        done, dead, code = _run_child(target, [jobs[i] for i in todo],
                                      [libraries[i] for i in todo], common, child)
        child = None  # a fresh child for what is left after a crash
        for k, result in done.items():
            results[todo[k]] = result
        if dead is None and len(done) < len(todo):  # died before starting one: say so
            dead = len(done)
        if dead is None:
            break
        results[todo[dead]] = (None, f"crashed: {_died(code)}")
        todo = [t for k, t in enumerate(todo) if k not in done and k != dead]
    return results


def _run_child(target: str, jobs: list[dict], libraries: list[bytes], common: dict,
               child: subprocess.Popen | None = None
               ) -> tuple[dict[int, tuple[object, str | None]], int | None, int]:
    """Run `jobs` in order in one child (`child`, started by start_child, or a new one):
    (index -> (value, error), for those that finished; the index running when the child
    died, if it died; the child's exit code)."""
    with tempfile.TemporaryDirectory(prefix="rk_isolated_") as tmp:
        paths = [os.path.join(tmp, f"k{i}.so") for i in range(len(jobs))]
        for path, library in zip(paths, libraries):
            with open(path, "wb") as f:
                f.write(library)
        job = os.path.join(tmp, "job.json")
        with open(job, "w") as f:
            json.dump({"target": target, "jobs": jobs, "paths": paths, "common": common}, f)
        if child is None:
            child = start_child(target)
        try:
            out, _ = child.communicate(f"{job}\n".encode(), timeout=CHILD_TIMEOUT_S)
            code = child.returncode
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
            code = -signal.SIGKILL
    index = {p: i for i, p in enumerate(paths)}
    done, running = {}, None
    for line in out.decode(errors="replace").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "started" in msg:
            running = index.get(msg["started"])
        elif "done" in msg:
            done[index[msg["done"]]] = (msg.get("value"), msg.get("error"))
            running = None
    return done, (running if code != 0 else None), code


def check_in_child(job: dict, library: bytes, common: dict) -> str | None:
    """One built kernel checked against its reference (run_jobs' child): None, or the
    error kind and message."""
    from raytune_kernels.cpu.measure import measure_built

    opts = MeasureOptions(threads=common["threads"], warmup=0, min_repeat_ms=0, repeats=1)
    r = measure_built(Compute.from_json(job["compute"]), Config.from_json(job["config"]),
                      library, opts)
    return r.error_kind and f"{r.error_kind}: {r.error_msg}"


def _died(code: int) -> str:
    if code == -signal.SIGKILL:
        return (f"killed its process (SIGKILL: ran past {CHILD_TIMEOUT_S:.0f} s, or out of "
                f"memory)")
    if code < 0:
        try:
            return f"killed its process by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed its process by signal {-code}"
    return f"ended its process with exit status {code}"


def check_isolated(items: list[tuple[Compute, Config]], mcpu: str | None = None,
                   threads: int = 1, child: subprocess.Popen | None = None
                   ) -> list[str | None]:
    """Build each (compute, config) (in parallel: cpu/parallel_build.py) and check it
    against its reference in a child process (`child`, from start_child(CHECK_CHILD),
    when given): None where it builds and matches, else why not. A kernel that kills the
    child (a segfault, an illegal instruction, a hang) is blamed alone; the rest are
    checked again in a fresh child."""
    return [error or value for value, error in _isolated(items, mcpu, CHECK_CHILD,
                                                         {"threads": threads}, child)]


def time_isolated(items: list[tuple[Compute, Config]], opts: MeasureOptions,
                  mcpu: str | None = None, child: subprocess.Popen | None = None
                  ) -> list[float]:
    """Build each (compute, config), check it against its reference and time it under
    `opts` (a measurer's way), one after another in a child process (`child`, from
    start_child(TIME_CHILD), when given): its median seconds, or inf where it does not
    build, check or run (a kernel that kills the child is blamed alone)."""
    return [math.inf if error else value for value, error in
            _isolated(items, mcpu, TIME_CHILD, {"opts": dataclasses.asdict(opts)}, child)]


def _isolated(items: list[tuple[Compute, Config]], mcpu: str | None, target: str,
              common: dict, child: subprocess.Popen | None
              ) -> list[tuple[object, str | None]]:
    """(value, None) of `target` (check_in_child, time_in_child) on each item built, in a
    child; (None, why not) where it does not lower or build, or the child raised."""
    from raytune_kernels.cpu.llvm.ir import render
    from raytune_kernels.cpu.parallel_build import build_all
    from raytune_kernels.cpu.schedules import lower

    results: list[tuple[object, str | None]] = [(None, None)] * len(items)
    texts: dict[int, str] = {}
    for i, (compute, cfg) in enumerate(items):
        try:
            texts[i] = render(lower(compute, cfg))
        except Exception as exc:  # a config that does not lower: its failure alone
            results[i] = (None, f"build_error: {type(exc).__name__}: {exc}")
    todo = []
    # built in parallel, and kept on disk: they are the kernels of the network to come
    for i, built in zip(texts, build_all(list(texts.values()), mcpu, persist=True)):
        if built.library is None:
            results[i] = (None, f"build_error: {built.error}")
        else:
            todo.append((i, *items[i], built.library))
    ran = run_jobs(target, [{"compute": c.to_json(), "config": cfg.to_json()}
                            for _, c, cfg, _ in todo], [lib for *_, lib in todo], common, child)
    for (i, *_), result in zip(todo, ran):
        results[i] = result
    return results


def time_in_child(job: dict, library: bytes, common: dict) -> float:
    """One built kernel checked against its reference, then timed (run_jobs' child): its
    median seconds; raises where it fails."""
    from raytune_kernels.cpu.measure import measure_built

    r = measure_built(Compute.from_json(job["compute"]), Config.from_json(job["config"]),
                      library, MeasureOptions(**common["opts"]))
    if r.error_kind:
        raise RuntimeError(f"{r.error_kind}: {r.error_msg}")
    return statistics.median(r.times)


CHECK_CHILD = "raytune_kernels.cpu.probe:check_in_child"
TIME_CHILD = "raytune_kernels.cpu.probe:time_in_child"
# what check_in_child and time_in_child need, imported by a child started ahead of its
# job (start_child)
CHILD_PRELOAD = ("torch", "raytune_kernels.cpu.measure", "raytune_kernels.frontend.reference")


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
    _, _, code = _run_child(CHECK_CHILD, [{"compute": PROBE.to_json(),
                                           "config": cfg.to_json()} for cfg, _ in built],
                            [lib for _, lib in built], {"threads": 1})
    if code == 0:
        return None
    if code != -signal.SIGILL:  # not an instruction the host lacks: say so, go on
        warnings.warn(f"the -mcpu={mcpu} probe could not run ({_died(code)}); going on "
                      "without it", stacklevel=3)
        return None
    from raytune_kernels.cpu.machine import host_isa

    host = host_cpu()[0]
    return (f"-mcpu={mcpu}: code built for it dies with SIGILL (illegal instruction) on "
            f"this host, {host} ({host_isa() or 'no vector ISA'}): the host lacks "
            f"instructions {mcpu} has; use -mcpu={host}, or a CPU this host can run")


def probe_libraries(mcpu: str) -> list[tuple[Config, bytes]]:
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
