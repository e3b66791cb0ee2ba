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
wall time per trial (1 / rate). The head's search work is timed apart, after the scaling
runs, in CPU seconds of this process: a tuning run of bench/search.py's three ResNet-18
convs (`--head-trials` trials measured by a one-measurer pipeline), whose proposals after
each task's first cost `proposal_s_per_trial` per trial, and whose learning (the cost
model's retraining) `learn_s_per_trial`; `head_s_per_trial` is their sum. Each task's
first proposal (it analyses the task's initial pool of candidates, once per task) and the
run's total per trial are reported apart. Last line of stdout: one JSON object.
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
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.space import Config
from raytune_kernels.task import Task
from raytune_kernels.tune.tuner import LocalSearchPool, TuneOptions, Tuner

# what the breakdown shows -> the PipelineStats phases it adds up
GROUPS = {"render": ("render",), "optimize": ("optimize",), "codegen": ("codegen",),
          "link": ("link",), "load": ("load",), "measure": ("check", "timing"),
          "transfer": ("queue", "call")}


HEAD_TASKS = ("conv2d 1x64x56x56 -> 64ch k3x3 s1 +bias+relu",
              "conv2d 1x256x14x14 -> 256ch k3x3 s1 +bias+relu",
              "conv2d 1x128x28x28 -> 256ch k3x3 s2 +bias+relu")  # bench/search.py's


def head_tasks(model, inputs) -> list[Task]:
    return [t for t in rk.extract_tasks(model, inputs) if t.compute.describe() in HEAD_TASKS]


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


class CpuTimedPool(LocalSearchPool):
    """The tuner's search pool, with the CPU seconds of its proposals and learning."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposals: list[tuple[float, int, bool]] = []  # (CPU s, configs, a task's first)
        self.learn_s = 0.0

    def propose(self, key: str, n: int):
        start, first = time.process_time(), not self.searches[key].measured
        out = super().propose(key, n)
        self.proposals.append((time.process_time() - start, len(out), first))
        return out

    def learn(self, records) -> None:
        start = time.process_time()
        super().learn(records)
        self.learn_s += time.process_time() - start


def head_run(tasks: list[Task], trials: int, batch: int, pipe: MeasurePipeline) -> dict:
    """CPU seconds per trial of the head's search work over a tuning run of `tasks`
    (`trials` in all, measured by `pipe`). A tuning round's: `proposal_s_per_trial`, the
    proposals after each task's first, per trial they proposed; `learn_s_per_trial`, the
    cost model's retraining, per trial of the run; `head_s_per_trial`, their sum. Apart:
    each task's first proposal (it analyses the task's initial pool, once per task), and
    the run's total per trial. XGBoost is imported before: a process does that once."""
    import xgboost  # noqa: F401

    pool = CpuTimedPool(tasks, cpu_backend(cpu_info()))
    tuner = Tuner(tasks, "llvm", cpu_info().name, pipe.run, pool, None, [],
                  TuneOptions(trials=trials, batch=batch))
    tuner.run()
    n = tuner.spent
    later = [(s, k) for s, k, first in pool.proposals if not first]
    first = [(s, k) for s, k, first in pool.proposals if first]

    def per_trial(props) -> float:
        return round(sum(s for s, _ in props) / max(1, sum(k for _, k in props)), 5)

    total = sum(s for s, _, _ in pool.proposals) + pool.learn_s
    return {"proposal_s_per_trial": per_trial(later),
            "learn_s_per_trial": round(pool.learn_s / n, 5),
            "head_s_per_trial": round(per_trial(later) + pool.learn_s / n, 5),
            "proposal_first_s_per_trial": per_trial(first),
            "head_run_s_per_trial": round(total / n, 5),
            "proposals": {"first": len(first), "later": len(later)},
            "head_trials": n, "head_tasks": len(tasks), "model_trained": pool.model.trained,
            "best_us": {t.key: round(s.best * 1e6, 1)
                        for t, s in zip(tasks, tuner.scheduler.states)}}


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
    p.add_argument("--head-trials", type=int, default=192,
                   help="trials of the tuning run that times the head's search work")
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
    pipe = MeasurePipeline(num_measurers=1, num_builders=args.builders or None, opts=opts)
    head = head_run(head_tasks(model, inputs), args.head_trials, args.batch, pipe)
    pipe.shutdown()
    ray.shutdown()
    for n, b in parts.items():
        serial = head["head_s_per_trial"]
        b["proposal_share"] = round(serial / (serial + b["wall_s_per_trial"]), 3)
    print(f"head: {head['head_s_per_trial'] * 1e3:.2f} ms of CPU per trial: proposals "
          f"{head['proposal_s_per_trial'] * 1e3:.2f} ms, learning "
          f"{head['learn_s_per_trial'] * 1e3:.2f} ms (a tuning run of {head['head_trials']} "
          f"trials on {head['head_tasks']} tasks; each task's first proposal "
          f"{head['proposal_first_s_per_trial'] * 1e3:.2f} ms per trial, the whole run "
          f"{head['head_run_s_per_trial'] * 1e3:.2f} ms per trial); with it, " +
          ", ".join(f"{b['proposal_share']:.0%} of a tuning round's time at {n} measurer(s)"
                    for n, b in parts.items()), file=sys.stderr)
    efficiency = {k: round(v / (int(k) * rates["1"]), 3) for k, v in rates.items()}
    print(json.dumps({"trials_per_s": rates, "efficiency": efficiency, "idle_fraction": idle,
                      "breakdown": parts, **head, "cores": cores, "task": task.key,
                      "cpu": cpu_info().name, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
