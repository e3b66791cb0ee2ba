"""Model-guided search vs random search with the same budget, on real measurements.

    python bench/search.py [--trials 128] [--seeds 3]

For 3 ResNet-18 conv tasks and each seed, the task is tuned alone twice: by the tuner
(evolutionary search ranked by the XGBoost cost model blended with the analytic cycle
estimate) and by random sampling of the same space, `trials` measurements each (built in 2 processes, measured here on 1 thread).
trials_to_95: trials until a strategy's best reaches 95% of the best throughput either
strategy found for that task and seed (mean over tasks and seeds); final_ratio: mean of
random best time / model best time; best_us: each task's and seed's best time per
strategy, and model_best_geomean_us their geometric mean for the model;
geomean_us_at_trials: per strategy, the geometric mean over tasks and seeds of the best
time after 8, 16, 32, 64 and 128 trials. No PyTorch baseline: this compares search strategies.
Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

import torch

import raytune_kernels as rk
from raytune_kernels import zoo
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.cpu.measure import measure_built
from raytune_kernels.measure import MeasureOptions, MeasureResult
from raytune_kernels.tune.tuner import LocalSearchPool, TuneOptions, Tuner
from raytune_kernels.backend import cpu_backend

OPTS = MeasureOptions(threads=1, min_repeat_ms=5, repeats=3)
TASKS = ("conv2d 1x64x56x56 -> 64ch k3x3 s1 +bias+relu",
         "conv2d 1x256x14x14 -> 256ch k3x3 s1 +bias+relu",
         "conv2d 1x128x28x28 -> 256ch k3x3 s2 +bias+relu")
CHECKPOINTS = (8, 16, 32, 64, 128)  # trials at which the best so far is reported


class RandomPool(LocalSearchPool):
    """The same searches, never guided: every proposal is a random sample (no cost model,
    no analytic estimate)."""

    def propose(self, key: str, n: int):
        return self.searches[key].sample(n)

    def learn(self, records) -> None:
        return None


def _build(item):
    task, cfg = item
    return build_for(task.compute, cfg)


def measure_fn(pool: ProcessPoolExecutor):
    def measure(items) -> list[MeasureResult]:
        built = list(pool.map(_build, items))
        return [measure_built(t.compute, c, b.library, OPTS, b.seconds) if b.library
                else MeasureResult.error("build_error", b.error or "", b.seconds)
                for (t, c), b in zip(items, built)]
    return measure


def curve(tuner: Tuner) -> list[float]:
    best, out = math.inf, []
    for r in tuner.records:
        best = min(best, r.median)
        out.append(best)
    return out


def run(task, strategy: str, trials: int, seed: int, pool, shared=None) -> list[float]:
    """Tune `task` alone; with `shared` (a LocalSearchPool over all benchmark tasks), the
    search uses that pool's one cost model, already trained on the tasks tuned before."""
    if strategy == "model":
        search = shared or LocalSearchPool([task], cpu_backend(cpu_info()), seed)
    else:
        search = RandomPool([task], cpu_backend(cpu_info()), seed)
    tuner = Tuner([task], "llvm", cpu_info().name, measure_fn(pool), search, None, [],
                  TuneOptions(trials=trials, batch=8, seed=seed))
    tuner.run()
    return curve(tuner)


def trials_to(curve_: list[float], target: float) -> int:
    return next((i + 1 for i, t in enumerate(curve_) if t <= target), len(curve_) + 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=128)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--shared-model", action="store_true",
                   help="tune the tasks one after another with one cost model, as "
                        "tune_network does (tasks teach each other)")
    args = p.parse_args()
    torch.set_num_threads(1)
    model, inputs = zoo.resnet18()
    tasks = [t for t in rk.extract_tasks(model, inputs) if t.compute.describe() in TASKS]
    to95 = {"model": [], "random": []}
    finals, best_us, at = [], {}, {"model": [], "random": []}
    with ProcessPoolExecutor(2) as pool:
        backend = cpu_backend(cpu_info())
        shared = {seed: LocalSearchPool(tasks, backend, seed) if args.shared_model else None
                  for seed in range(args.seeds)}
        for task in tasks:
            for seed in range(args.seeds):
                curves = {s: run(task, s, args.trials, seed, pool, shared[seed])
                          for s in ("model", "random")}
                best = min(c[-1] for c in curves.values())
                for s, c in curves.items():
                    to95[s].append(trials_to(c, best / 0.95))
                finals.append(curves["random"][-1] / curves["model"][-1])
                for s_, c in curves.items():
                    at[s_].append([c[min(k, len(c)) - 1] for k in CHECKPOINTS])
                best_us.setdefault(task.compute.describe(), {})[str(seed)] = {
                    s: round(c[-1] * 1e6, 1) for s, c in curves.items()}
                print(f"{task.compute.describe():<48} seed {seed}: best model "
                      f"{curves['model'][-1] * 1e6:.0f} us random {curves['random'][-1] * 1e6:.0f}"
                      f" us; to 95%: model {to95['model'][-1]} random {to95['random'][-1]}",
                      file=sys.stderr, flush=True)
    a, b = statistics.mean(to95["model"]), statistics.mean(to95["random"])
    model_best = [b_["model"] for seeds in best_us.values() for b_ in seeds.values()]
    print(json.dumps({"trials_to_95": {"model": round(a, 1), "random": round(b, 1)},
                      "trials_ratio": round(a / b, 3),
                      "final_ratio": round(statistics.mean(finals), 3),
                      "model_best_geomean_us": round(statistics.geometric_mean(model_best), 1),
                      "best_us": best_us,
                      "geomean_us_at_trials": {
                          s_: {str(k): round(statistics.geometric_mean(
                              [row[j] for row in rows]) * 1e6, 1)
                              for j, k in enumerate(CHECKPOINTS)} for s_, rows in at.items()},
                      "trials_per_task": args.trials, "seeds": args.seeds, "threads": 1,
                      "shared_model": args.shared_model,
                      "cpu": cpu_info().name}))


if __name__ == "__main__":
    main()
