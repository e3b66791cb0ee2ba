"""Measuring throughput of the Ray pipeline on a real task: trials per second with 1 and 2
measurers (each owning one core), and the fraction of time measurers sat idle.

    python bench/throughput.py [--trials 24] [--builders N]

With 1 measurer, builders work on the other core while it measures; with 2 measurers
every core measures, so builds and measurements alternate by batch (a build never shares
a core with a measurement). PyTorch is not involved: this measures our pipeline only.
Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time

import ray
import torch

import raytune_kernels as rk
from actors.pipeline import MeasurePipeline
from raytune_kernels import zoo
from raytune_kernels.codegen.build import cpu_info
from raytune_kernels.codegen.schedules import space_for
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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    opts = MeasureOptions(threads=1, min_repeat_ms=10, repeats=3, timeout_s=30)
    rates, idle = {}, {}
    for n in (1, 2):
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
    print(json.dumps({"trials_per_s": rates, "idle_fraction": idle, "task": task.key,
                      "cpu": cpu_info().name, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
