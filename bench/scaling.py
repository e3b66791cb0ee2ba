"""Scaling of the Ray measuring pipeline on a real task: trials per second with 1, 2, 4, ...
measurers (each owning one core, as many as this machine has cores for), the scaling
efficiency (rate / (n x rate with one)), the fraction of time measurers sat idle, and
where each trial's time went.

    python bench/scaling.py [--trials 24] [--builders N] [--batch 8]

Builders use the cores no measurer owns; when every core measures, builds and measurements
alternate by batch (a build never shares a core with a measurement). PyTorch is not
involved: this measures our pipeline only.

The breakdown (per measurer count) follows a trial from its build's submission to its
result, in mean seconds and shares of that time: rendering (lowering and LLVM IR text),
LLVM optimisation (parse, verify, passes), code generation, linking (cc -shared), loading
(the .so written and dlopened in the measurer), measurement (checking and timing), and
Ray transfer and queueing (the rest: waiting for a builder and for a free measurer, and
the calls' transfers). Trials overlap in the pipeline, so a trial takes longer than the
wall time per trial (1 / rate). The proposal (the search ranking candidates with a cost
model trained on this run's results, as every tuning round after the first does) is
timed apart, in this process after the pipeline runs, as `proposal_s_per_trial`, with
the cost model's training per round (`learn_s_per_trial`). Last line of stdout: one JSON
object.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import ray
import torch

import raytune_kernels as rk
from actors.pipeline import MeasurePipeline, PipelineStats
from raytune_kernels import zoo
from raytune_kernels.backend import cpu_backend
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.schedules import space_for
from raytune_kernels.measure import MeasureOptions, MeasureResult
from raytune_kernels.space import Config
from raytune_kernels.task import Task
from raytune_kernels.tune.records import record_of
from raytune_kernels.tune.tuner import LocalSearchPool

# what the breakdown shows -> the PipelineStats phases it adds up
GROUPS = {"render": ("render",), "optimize": ("optimize",), "codegen": ("codegen",),
          "link": ("link",), "load": ("load",), "measure": ("check", "timing"),
          "transfer": ("queue", "call")}


def breakdown(stats: PipelineStats, trials: int) -> dict:
    """Mean seconds per trial of each phase group, and its share of the trial's time."""
    n, spent = max(stats.timed_trials, 1), stats.phase_seconds()
    trial_s = sum(spent.values()) / n
    groups = {g: sum(spent[p] for p in ps) / n for g, ps in GROUPS.items()}
    return {"trial_s": round(trial_s, 4), "wall_s_per_trial": round(stats.wall_s / trials, 4),
            "timed_trials": stats.timed_trials,
            "phases": {g: {"s": round(s, 4), "share": round(s / trial_s, 3) if trial_s else 0}
                       for g, s in groups.items()},
            "detail_s": {p: round(s / n, 4) for p, s in spent.items()}}


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def time_proposal(task: Task, configs: list[Config], results: list[MeasureResult],
                  batch: int, repeats: int = 3) -> dict:
    """Seconds per trial of proposing a batch: first with no model (the estimate ranks a
    random pool), then, as every later round, with the cost model trained on `results`
    (mean of `repeats` rounds); and of that training."""
    cpu = cpu_info()
    pool = LocalSearchPool([task], cpu_backend(cpu))
    first = _seconds(lambda: pool.propose(task.key, batch))
    pool.observe(task.key, configs, [r.median for r in results])
    records = [record_of(task.key, "llvm", cpu.name, c.to_json(), r)
               for c, r in zip(configs, results)]
    learn = _seconds(lambda: pool.learn(records))
    model = sum(_seconds(lambda: pool.propose(task.key, batch)) for _ in range(repeats))
    return {"proposal_s_per_trial": round(model / repeats / batch, 4),
            "proposal_untrained_s_per_trial": round(first / batch, 4),
            "learn_s_per_trial": round(learn / batch, 4), "model_trained": pool.model.trained}


def run_pipeline(n: int, task: Task, configs: list[Config], args, opts: MeasureOptions):
    """(pipeline stats, results, wall seconds) of the configs measured with n measurers."""
    pipe = MeasurePipeline(num_measurers=n, num_builders=args.builders or None, opts=opts)
    start, results = time.perf_counter(), []
    for i in range(0, len(configs), args.batch):
        results += pipe.run([(task, c) for c in configs[i:i + args.batch]])
    wall = time.perf_counter() - start
    stats, phased = pipe.stats, pipe.phased
    pipe.shutdown()
    print(f"{n} measurer(s): {len(configs)} trials ({sum(r.ok for r in results)} valid) in "
          f"{wall:.1f} s, {len(configs) / wall:.3f} trials/s, measurers idle "
          f"{stats.idle_fraction:.0%}, {'phased' if phased else 'overlapped'} builds",
          file=sys.stderr)
    return stats, results, wall


def describe(b: dict) -> str:
    parts = ", ".join(f"{g} {p['share']:.0%} ({p['s'] * 1e3:.0f} ms)"
                      for g, p in b["phases"].items())
    return (f"  a trial: {b['trial_s']:.3f} s from build submission to result "
            f"({b['wall_s_per_trial']:.3f} s of wall time per trial): {parts}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--builders", type=int, default=0, help="0: one per free core")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    model, inputs = zoo.resnet18()
    task = next(t for t in rk.extract_tasks(model, inputs)
                if t.compute.describe().startswith("conv2d 1x128x28x28 -> 128ch k3x3 s1"))
    space = space_for(task.compute, cpu_info())
    rng = random.Random(0)
    configs = [space.sample(rng) for _ in range(args.trials)]
    cores = len(os.sched_getaffinity(0))
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    opts = MeasureOptions(threads=1, min_repeat_ms=10, repeats=3, timeout_s=30)
    rates, idle, parts = {}, {}, {}
    counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n < cores] + [cores]
    for n in counts:
        stats, results, wall = run_pipeline(n, task, configs, args, opts)
        rates[str(n)] = round(len(configs) / wall, 3)
        idle[str(n)] = round(stats.idle_fraction, 3)
        parts[str(n)] = breakdown(stats, len(configs))
        print(describe(parts[str(n)]), file=sys.stderr)
    ray.shutdown()
    proposal = time_proposal(task, configs, results, args.batch)
    for n, b in parts.items():
        serial = proposal["proposal_s_per_trial"] + proposal["learn_s_per_trial"]
        b["proposal_share"] = round(serial / (serial + b["wall_s_per_trial"]), 3)
    print(f"proposal: {proposal['proposal_s_per_trial'] * 1e3:.0f} ms per trial with the "
          f"trained cost model ({proposal['proposal_untrained_s_per_trial'] * 1e3:.0f} ms "
          f"untrained), its training {proposal['learn_s_per_trial'] * 1e3:.0f} ms per trial; "
          f"with learning, " + ", ".join(f"{b['proposal_share']:.0%} of a tuning round's "
                                         f"time at {n} measurer(s)" for n, b in parts.items()),
          file=sys.stderr)
    efficiency = {k: round(v / (int(k) * rates["1"]), 3) for k, v in rates.items()}
    print(json.dumps({"trials_per_s": rates, "efficiency": efficiency, "idle_fraction": idle,
                      "breakdown": parts, **proposal, "cores": cores, "task": task.key,
                      "cpu": cpu_info().name, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
