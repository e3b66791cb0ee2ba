"""How well the analytic cycle estimate (raytune_kernels/estimate.py) orders real timings.

    python bench/estimate.py [--configs 160] [--cold] [--model resnet18] [--dump FILE]

For every conv and dense task of the model (a zoo name; ResNet-18 by default), `configs`
random configs are built (2 processes) and timed here on 1 thread (with --cold, with the
weights out of cache, as tune_network times them). Per task: the rank correlation between
estimated cycles and measured time, and whether the estimate's first 8 picks hold a config
within 5% of the best measured, against the chance that 8 random picks do. The estimate
reads the host's measured machine model (cpu/machine.py), reported beside the figures, so
that a poor correlation can be told apart as a model problem (wrong pipes, latency or loads
for this CPU) or an estimate problem. `--dump` writes every timed config as a JSON line
(task key, compute, config, measured seconds, estimated cycles), so that a change to the
estimate can be weighed against the same timings. No PyTorch baseline: this checks a search
heuristic, not kernels. Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

import raytune_kernels as rk
from raytune_kernels import zoo
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.cpu.schedules import lower, space_for
from raytune_kernels.cpu.estimate import cycles
from raytune_kernels.cpu.measure import measure_built
from raytune_kernels.measure import MeasureOptions

PICKS = 8


def _build(item):
    task, cfg = item
    return build_for(task.compute, cfg)


def _ranks(v) -> np.ndarray:
    return np.argsort(np.argsort(np.asarray(v)))


def random_hit_chance(times: np.ndarray, good: float) -> float:
    """Probability that PICKS configs drawn without replacement include a good one."""
    n, bad = len(times), int(np.sum(times > good))
    return 1.0 - math.comb(bad, PICKS) / math.comb(n, PICKS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", type=int, default=160)
    p.add_argument("--cold", action="store_true", help="weights out of cache while timed")
    p.add_argument("--model", default="resnet18", help="a zoo model (raytune_kernels.zoo)")
    p.add_argument("--dump", default=None, help="JSON lines of every timed config")
    args = p.parse_args()
    torch.set_num_threads(1)
    opts = MeasureOptions(threads=1, min_repeat_ms=5, repeats=3, cold_weights=args.cold)
    model, inputs = getattr(zoo, args.model)()
    tasks = [t for t in rk.extract_tasks(model, inputs) if t.compute.op in ("conv2d", "dense")]
    cpu = cpu_info()
    print(f"machine model: {cpu.machine.describe()}", file=sys.stderr, flush=True)
    rows, dumped = [], []
    with ProcessPoolExecutor(2) as pool:
        for task in tasks:
            space, rng = space_for(task.compute, cpu), random.Random(task.key)
            cfgs = list(dict.fromkeys(space.sample(rng) for _ in range(4 * args.configs)))
            cfgs = cfgs[: args.configs]
            built = list(pool.map(_build, [(task, c) for c in cfgs]))
            timed = [(c, measure_built(task.compute, c, b.library, opts, b.seconds))
                     for c, b in zip(cfgs, built) if b.library]
            timed = [(c, r.median) for c, r in timed if r.ok]
            times = np.array([t for _, t in timed])
            est = np.array([cycles(lower(task.compute, c), cpu.machine) for c, _ in timed])
            dumped += [{"task": task.key, "compute": task.compute.to_json(),
                        "config": c.to_json(), "seconds": t, "estimate": float(e)}
                       for (c, t), e in zip(timed, est)]
            good = times.min() / 0.95
            rho = float(np.corrcoef(_ranks(est), _ranks(times))[0, 1])
            hit = bool(times[np.argsort(est, kind="stable")[:PICKS]].min() <= good)
            chance = random_hit_chance(times, good)
            rows.append((rho, hit, chance))
            print(f"{task.compute.describe():<50} {len(timed)} configs: rank corr {rho:.2f}, "
                  f"estimate's first {PICKS} within 5%: {hit} (random: {chance:.2f})",
                  file=sys.stderr, flush=True)
    if args.dump:
        with open(args.dump, "w") as f:
            f.writelines(json.dumps(d) + "\n" for d in dumped)
    print(json.dumps({"model": args.model, "tasks": len(rows), "configs_per_task": args.configs,
                      "cold": args.cold,
                      "mean_rank_corr": round(statistics.mean(r for r, _, _ in rows), 3),
                      "estimate_hits_95": sum(h for _, h, _ in rows),
                      "random_hits_95_expected": round(sum(c for _, _, c in rows), 1),
                      "threads": 1, "cpu": cpu.name, "machine": cpu.machine.to_json()}))


if __name__ == "__main__":
    main()
