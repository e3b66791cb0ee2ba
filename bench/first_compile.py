"""First-compile benchmark: how long an untuned compile_network takes, cold, and where the
time goes.

    python bench/first_compile.py [MODEL ...] [--threads 2] [--runs 3] [--warm]

MODEL is a bench/models.py name (default: torchvision/resnet50 and hf/BertModel). Each run
of each model is a fresh process with a fresh, empty cache directory (RAYTUNE_KERNELS_CACHE:
no kernel library and no transform timing from an earlier run), which builds the model
(random weights, not timed), then times compile_network(model, inputs) with no records (every
task runs the analytic estimate's choice, untuned) and its defaults (the network is checked
against the model once). The phases are the wall seconds spent inside compile_network's
stages (capture, partition, candidates, transform timing, layout ILP, the isolated check of
the untuned kernels with their builds, planning with weight packing and the transforms'
builds, the network's buffers and native runners, the check against the model), clocked by
wrapping those functions; "of which" lines are seconds inside them (IR rendering, LLVM
passes and code generation, linking, weight packing), counted in this process only.

Per model: the median over --runs of the compile seconds, and each run's phases. Last line
of stdout: one JSON object {"bench", "cpu", "threads", "runs", "models": {name:
{"compile_s" (median), "compile_s_runs", "import_s", "phases" (of the median run),
"of_which", "kernels", "transforms", "steps", and with --warm "warm_compile_s": the median
of compiles run again, each in a fresh process, with the cache its cold run left}}}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODELS = ("torchvision/resnet50", "hf/BertModel")

# (phase, module, attribute): top-level stages of compile_network_cpu, in order
PHASES = (("capture", "raytune_kernels.compile.cpu_network", "capture"),
          ("partition", "raytune_kernels.compile.cpu_network", "partition"),
          ("candidates", "raytune_kernels.compile.cpu_network", "_candidates"),
          ("transform_timing", "raytune_kernels.compile.cpu_network", "measure_transforms"),
          ("layout_ilp", "raytune_kernels.compile.cpu_network", "choose"),
          ("isolated_check", "raytune_kernels.compile.cpu_network", "_drop_failed_untuned"),
          ("plan", "raytune_kernels.compile.cpu_plan", "Planner.task"),
          ("plan", "raytune_kernels.compile.cpu_plan", "Planner.glue"),
          ("plan", "raytune_kernels.compile.cpu_plan", "Planner.outputs"),
          ("network", "raytune_kernels.compile.cpu_network", "CompiledNetwork.__init__"),
          ("check_network", "raytune_kernels.compile.cpu_network", "check_network"))
# seconds spent inside the phases above, by what does the work (in this process: a build
# child's work shows only as the wall time of parallel_builds; the lines overlap)
OF_WHICH = (("render_ir", "raytune_kernels.cpu.llvm.ir", "render"),
            ("llvm", "raytune_kernels.cpu.build", "compile_object"),
            ("link", "raytune_kernels.cpu.build", "link_shared"),
            ("parallel_builds", "raytune_kernels.cpu.parallel_build", "build_all"),
            ("pack_weights", "raytune_kernels.compile.cpu_plan", "pack"),
            ("aligned_copy", "raytune_kernels.compile.cpu_plan", "aligned"))


def _wrap(totals: dict, phase: str, module: str, attr: str, depth: list) -> None:
    """Replace module.attr (or module.Class.method) by a function that adds its outermost
    calls' wall seconds to totals[phase]; every module that imported the name by value
    gets the wrapper too. A module or attribute this version lacks is left alone."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError:  # a version without that module
        return
    owner, _, name = attr.rpartition(".")
    holder = getattr(mod, owner) if owner else mod
    fn = getattr(holder, name, None)
    if fn is None:
        return

    def timed(*args, **kwargs):
        depth.append(phase)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            depth.pop()
            if phase not in depth:  # recursion or a nested call of the same phase
                totals[phase] = totals.get(phase, 0.0) + time.perf_counter() - start
    setattr(holder, name, timed)
    if not owner:
        for other in list(sys.modules.values()):
            if getattr(other, "__name__", "").startswith("raytune_kernels") and \
                    getattr(other, name, None) is fn:
                setattr(other, name, timed)


def measure(name: str, threads: int) -> dict:
    """One cold compile of `name` in this process (the caller made the cache dir fresh)."""
    start = time.perf_counter()
    import warnings

    import torch

    sys.path.insert(0, HERE)
    import models
    from raytune_kernels.compile.api import compile_network
    import raytune_kernels.compile.cpu_network  # noqa: F401  (wrapped below)
    import raytune_kernels.compile.cpu_plan  # noqa: F401
    import raytune_kernels.cpu.kernel  # noqa: F401
    import raytune_kernels.layout.costs  # noqa: F401
    imported = time.perf_counter() - start

    torch.set_num_threads(threads)
    model, inputs = models.all_models()[name]()
    phases: dict[str, float] = {}
    inner: dict[str, float] = {}
    for phase, module, attr in PHASES:
        _wrap(phases, phase, module, attr, [])
    for phase, module, attr in OF_WHICH:
        _wrap(inner, phase, module, attr, [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        net = compile_network(model, inputs, None, threads=threads)
        took = time.perf_counter() - start
    phases["other"] = took - sum(phases.values())
    return {"compile_s": took, "import_s": imported,
            "phases": {k: round(v, 3) for k, v in phases.items()},
            "of_which": {k: round(v, 3) for k, v in inner.items()},
            "kernels": sum(s.kind == "kernel" for s in net.steps),
            "transforms": sum(s.kind == "transform" for s in net.steps),
            "steps": len(net.steps)}


def run_fresh(name: str, threads: int, warm: bool = False) -> dict:
    """measure() in a fresh process with a fresh, empty cache directory; with `warm`, once
    more in another fresh process with the cache the first one left ("warm_compile_s")."""
    with tempfile.TemporaryDirectory(prefix="rk_first_compile_") as cache:
        out = _child(name, threads, cache)
        if warm:
            out["warm_compile_s"] = _child(name, threads, cache)["compile_s"]
    return out


def _child(name: str, threads: int, cache: str) -> dict:
    env = {**os.environ, "RAYTUNE_KERNELS_CACHE": cache}
    proc = subprocess.run([sys.executable, __file__, "--child", name, "--threads",
                           str(threads)], capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"first_compile: {name} failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warm", action="store_true",
                   help="also compile again with the cache each cold run left")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.threads)))
        return
    from raytune_kernels.cpu.build import host_cpu

    out = {"bench": "first_compile", "cpu": host_cpu()[0], "threads": args.threads,
           "runs": args.runs, "models": {}}
    for name in args.models:
        runs = [run_fresh(name, args.threads, args.warm) for _ in range(args.runs)]
        for r in runs:
            print(f"{name}: {r['compile_s']:.2f} s  {r['phases']}  of which {r['of_which']}",
                  flush=True)
        times = [r["compile_s"] for r in runs]
        mid = sorted(runs, key=lambda r: r["compile_s"])[len(runs) // 2]
        out["models"][name] = {"compile_s": round(statistics.median(times), 3),
                               "compile_s_runs": [round(t, 3) for t in times],
                               **({"warm_compile_s": round(statistics.median(
                                   r["warm_compile_s"] for r in runs), 3)}
                                  if args.warm else {}),
                               **{k: mid[k] for k in ("import_s", "phases", "of_which",
                                                      "kernels", "transforms", "steps")}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
