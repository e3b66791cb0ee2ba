"""Scaling of the Ray measuring pipeline on a real task: trials per second with 1, 2, 4, ...
measurers (each owning one core, as many as this machine has cores for), the scaling
efficiency (rate / (n x rate with one)), and the fraction of time measurers sat idle.

    python bench/scaling.py [--trials 24] [--builders N]

Builders use the cores no measurer owns; when every core measures, builds and measurements
alternate by batch (a build never shares a core with a measurement). PyTorch is not
involved: this measures our pipeline only. Last line of stdout: one JSON object.
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
from actors.pipeline import MeasurePipeline
from raytune_kernels import zoo
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.schedules import space_for
from raytune_kernels.measure import MeasureOptions


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
    rates, idle = {}, {}
    counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n < cores] + [cores]
    for n in counts:
        pipe = MeasurePipeline(num_measurers=n, num_builders=args.builders or None, opts=opts)
        start = time.perf_counter()
        ok = 0
        for i in range(0, len(configs), args.batch):
            batch = configs[i:i + args.batch]
            ok += sum(r.ok for r in pipe.run([(task, c) for c in batch]))
        wall = time.perf_counter() - start
        rates[str(n)] = round(len(configs) / wall, 3)
        idle[str(n)] = round(pipe.stats.idle_fraction, 3)
        print(f"{n} measurer(s): {len(configs)} trials ({ok} valid) in {wall:.1f} s, "
              f"{rates[str(n)]} trials/s, measurers idle {idle[str(n)]:.0%}, "
              f"{'phased' if pipe.phased else 'overlapped'} builds", file=sys.stderr)
        pipe.shutdown()
    ray.shutdown()
    efficiency = {k: round(v / (int(k) * rates["1"]), 3) for k, v in rates.items()}
    print(json.dumps({"trials_per_s": rates, "efficiency": efficiency, "idle_fraction": idle,
                      "cores": cores, "task": task.key, "cpu": cpu_info().name,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
