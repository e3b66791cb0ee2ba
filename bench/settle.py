"""Whether a record can be trusted: candidates timed again and again as the measurers time
them, with settling (MeasureOptions' default) and without.

    python bench/settle.py [--model resnet18] [--threads 2] [--configs 6] [--times 4]

For `configs` random configs of every conv and dense task of the model (built once, 2
processes), each candidate is measured `times` times under each protocol, the two taking
turns measurement by measurement, with tune_network's options (3 repeats of at least 10 ms,
weights cold, `threads` threads): "settled" retimes a set of repeats whose median lies more
than 15% above its fastest (up to 2 retries, the most settled set kept; timing.py),
"plain" keeps the first set. Per protocol:

  disturbed      the share of measurements whose kept repeats lie that far apart (a
                 record the search learns from, and the plan prices, with a wrong time)
  spread         each candidate's slowest measured median over its fastest: the median
                 and the 90th and 99th percentiles over the candidates (how far two
                 measurements of one candidate can disagree)
  seconds        what a measurement took, median and mean (the cost of the retries)
  round_pace     per round, the median over candidates of that round's median over the
                 candidate's median of all rounds: a machine whose speed drifts between
                 rounds (a shared VM) moves every candidate alike, and shows here

No PyTorch baseline: this checks the measuring protocol, not kernels. Last line of stdout:
one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

import raytune_kernels as rk
from raytune_kernels import zoo
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.measure import measure_built
from raytune_kernels.cpu.schedules import space_for
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.timing import unsettled


def _build(item):
    task, cfg = item
    return build_for(task.compute, cfg)


def summary(medians: list[list[float]], disturbed: list[bool], seconds: list[float],
            settle: float) -> dict:
    """One protocol's figures (module docstring) from each candidate's medians, whether
    each measurement's kept repeats lie over `settle` apart, and each measurement's time."""
    spread = np.array([max(m) / min(m) for m in medians if len(m) > 1])
    whole = [m for m in medians if len(m) == max(len(x) for x in medians)]
    pace = [statistics.median(m[r] / statistics.median(m) for m in whole)
            for r in range(len(whole[0]))] if whole else []
    return {"measurements": len(disturbed),
            "disturbed": round(sum(disturbed) / max(len(disturbed), 1), 4),
            "disturbed_count": sum(disturbed),
            "spread": {"median": round(float(np.median(spread)), 4),
                       "p90": round(float(np.percentile(spread, 90)), 4),
                       "p99": round(float(np.percentile(spread, 99)), 4),
                       "max": round(float(spread.max()), 4)},
            "seconds": {"median": round(statistics.median(seconds), 4),
                        "mean": round(statistics.mean(seconds), 4)},
            "round_pace": [round(x, 4) for x in pace], "settle": settle}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", help="a zoo model (raytune_kernels.zoo)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--configs", type=int, default=6, help="random configs a task")
    p.add_argument("--times", type=int, default=4, help="measurements a candidate and protocol")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    settled = MeasureOptions(threads=args.threads, min_repeat_ms=10, repeats=3, timeout_s=30,
                             cold_weights=True)
    protocols = {"settled": settled,
                 "plain": dataclasses.replace(settled, settle=0.0, retries=0)}
    model, inputs = getattr(zoo, args.model)()
    tasks = [t for t in rk.extract_tasks(model, inputs) if t.compute.op in ("conv2d", "dense")]
    cpu = cpu_info()
    cands = []
    with ProcessPoolExecutor(2) as pool:
        for task in tasks:
            space, rng = space_for(task.compute, cpu), random.Random(task.key)
            cfgs = list(dict.fromkeys(space.sample(rng) for _ in range(4 * args.configs)))
            cfgs = cfgs[: args.configs]
            built = pool.map(_build, [(task, c) for c in cfgs])
            cands += [(task, c, b) for c, b in zip(cfgs, built) if b.library]
    print(f"{len(cands)} candidates of {len(tasks)} tasks built on {cpu.name}",
          file=sys.stderr, flush=True)
    medians = {k: [[] for _ in cands] for k in protocols}
    disturbed = {k: [] for k in protocols}
    seconds = {k: [] for k in protocols}
    for r in range(args.times):
        for i, (task, cfg, built) in enumerate(cands):
            order = list(protocols) if (r + i) % 2 == 0 else list(protocols)[::-1]
            for name in order:
                opts = protocols[name]
                res = measure_built(task.compute, cfg, built.library, opts)
                if not res.ok:
                    continue
                medians[name][i].append(res.median)
                disturbed[name].append(unsettled(list(res.times)) > settled.settle)
                seconds[name].append(res.run_s)
        print(f"round {r + 1}/{args.times}: " + ", ".join(
            f"{k} {sum(v)} of {len(v)} disturbed" for k, v in disturbed.items()),
            file=sys.stderr, flush=True)
    out = {k: summary(medians[k], disturbed[k], seconds[k], protocols[k].settle)
           for k in protocols}
    for k, s in out.items():
        print(f"{k:8s} disturbed {s['disturbed']:.1%} of {s['measurements']}; a candidate's "
              f"medians apart: median {s['spread']['median']:.3f}x, p90 {s['spread']['p90']:.3f}x,"
              f" p99 {s['spread']['p99']:.3f}x; a measurement {s['seconds']['median']:.3f} s "
              f"(mean {s['seconds']['mean']:.3f}); rounds' pace "
              + " ".join(f"{x:.3f}" for x in s["round_pace"]), file=sys.stderr, flush=True)
    print(json.dumps({"bench": "settle", "model": args.model, "cpu": cpu.name,
                      "threads": args.threads, "candidates": len(cands), "tasks": len(tasks),
                      "times": args.times, "retries": settled.retries, **out}))


if __name__ == "__main__":
    main()
