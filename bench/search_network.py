"""A whole network tuned at a budget, once per search strategy, seeds paired.

    python bench/search_network.py resnet18 [--trials 200] [--seeds 3] [--threads 1]
        [--strategies model,model_one_pick]

For each seed, every strategy tunes all of the model's tasks from nothing with `trials`
measurements (built in 2 processes, measured here on `threads` threads, weights cold, as
tune_network does), in turn; the strategies are bench/search.py's guided ones (model, the
tuner's search; model_one_pick, without its per-family shares of a batch; model_no_probe,
without probing the families a task has no measurement of). Reports each run's
estimated network latency (sum of weight x best time) and, per seed, each strategy's
over the first's. No PyTorch baseline: this compares search strategies at the budget of a
first tuning run (bench/search.py --history compares them on one task resumed from a
long one). Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

import torch

import raytune_kernels as rk
from raytune_kernels import zoo
from raytune_kernels.backend import cpu_backend
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.tune.tuner import LocalSearchPool, TuneOptions, Tuner
from search import SEARCH_OPTIONS, measure_fn, strategies_from


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--strategies", default="model,model_one_pick",
                   help=f"comma-separated, of {', '.join(SEARCH_OPTIONS)}")
    args = p.parse_args()
    strategies = strategies_from(args.strategies, SEARCH_OPTIONS)
    torch.set_num_threads(args.threads)
    model, inputs = getattr(zoo, args.model)()
    tasks = rk.extract_tasks(model, inputs)
    cpu = cpu_info()
    backend = cpu_backend(cpu, args.threads)
    estimated = {s: [] for s in strategies}
    with ProcessPoolExecutor(2) as pool:
        for seed in range(args.seeds):
            for s in strategies:
                search = LocalSearchPool(tasks, backend, seed, SEARCH_OPTIONS[s])
                tuner = Tuner(tasks, "llvm", cpu.name, measure_fn(pool, args.threads, True),
                              search, None, [], TuneOptions(trials=args.trials, batch=8,
                                                            seed=seed, threads=args.threads))
                tuner.run()
                estimated[s].append(tuner.scheduler.objective())
                print(f"seed {seed} {s}: estimated {estimated[s][-1] * 1e3:.3f} ms",
                      file=sys.stderr, flush=True)
    first = strategies[0]
    over = {s: [round(b / a, 3) for a, b in zip(estimated[first], estimated[s])]
            for s in strategies[1:]}
    print(json.dumps({"bench": "search_network", "model": args.model, "trials": args.trials,
                      "seeds": args.seeds, "threads": args.threads, "strategies": strategies,
                      "estimated_ms": {s: [round(v * 1e3, 3) for v in vs]
                                       for s, vs in estimated.items()},
                      "over_first": over,
                      "over_first_median": {s: statistics.median(v) for s, v in over.items()},
                      "cpu": cpu.name}))


if __name__ == "__main__":
    main()
