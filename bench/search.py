"""Model-guided search vs random search with the same budget, on real measurements.

    python bench/search.py [--trials 128] [--seeds 3] [--threads 1]
        [--model resnet18 --tasks "conv2d 1x512x7x7 -> 512ch k3x3 s1 +bias+relu" ...]
        [--strategies model,random,model_one_pick,model_no_probe] [--cold] [--history RECORDS]

For each task (default: 3 ResNet-18 conv tasks) and each seed, the task is tuned alone
once per strategy, `trials` measurements each (built in 2 processes, measured here on
`threads` threads): model, the tuner's search (evolutionary, ranked by the XGBoost cost
model blended with the analytic cycle estimate); random, random sampling of the same space;
model_one_pick, the tuner's search without its per-family shares of a batch
(SearchOptions.part_picks off: kernel families compete for picks by rank alone);
model_no_probe, without probing the families a resumed task has no records of
(SearchOptions.probe = 0).
trials_to_95: trials until a strategy's best reaches 95% of the best throughput any
strategy found for that task and seed (mean over tasks and seeds); final_ratio: mean of
random best time / model best time (where both ran); best_us: each task's and seed's best
time per strategy, with the algorithm of each best (best_algorithm), and
model_best_geomean_us their geometric mean for the model; geomean_us_at_trials: per
strategy, the geometric mean over tasks and seeds of the best time after 8, 16, 32, 64
and 128 trials. --cold times the weights out of cache, as tune_network does. --history
resumes from a model's records (tune_network's file, or REV:PATH for a git revision's
copy, at these threads and --cold): each search starts from its task's records, with the
cost model trained on every task's, as when tuning the network goes on; the curves then
count the new trials alone, and history_best gives each task's trials and best before.
No PyTorch baseline: this compares search strategies.
Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

import torch

import raytune_kernels as rk
from raytune_kernels import zoo
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.cpu.measure import measure_built
from raytune_kernels.measure import MeasureOptions, MeasureResult
from raytune_kernels.tune.records import load_records
from raytune_kernels.tune.search import SearchOptions
from raytune_kernels.tune.tuner import LocalSearchPool, TuneOptions, Tuner
from raytune_kernels.backend import cpu_backend
from records_ab import pinned, records_file

# the guided strategies' search options; "random" samples the space unguided
SEARCH_OPTIONS = {"model": SearchOptions(), "model_one_pick": SearchOptions(part_picks=False),
                  "model_no_probe": SearchOptions(probe=0)}
STRATEGIES = ("model", "random", "model_one_pick", "model_no_probe")
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


def measure_fn(pool: ProcessPoolExecutor, threads: int, cold: bool):
    opts = MeasureOptions(threads=threads, min_repeat_ms=5, repeats=3, cold_weights=cold)

    def measure(items) -> list[MeasureResult]:
        built = list(pool.map(_build, items))
        return [measure_built(t.compute, c, b.library, opts, b.seconds) if b.library
                else MeasureResult.error("build_error", b.error or "", b.seconds)
                for (t, c), b in zip(items, built)]
    return measure


def curve(tuner: Tuner, resumed: int = 0) -> tuple[list[float], str]:
    """The best time after each trial past the first `resumed` records, and the algorithm
    of the last best."""
    best, out, algorithm = math.inf, [], "-"
    for r in tuner.records[resumed:]:
        if r.median < best:
            best, algorithm = r.median, r.config.get("algorithm", "-")
        out.append(best)
    return out, algorithm


def run(task, strategy: str, trials: int, seed: int, pool, args, shared=None,
        model_tasks=(), history=()) -> tuple[list[float], str]:
    """Tune `task` alone; with `shared` (a LocalSearchPool over all benchmark tasks), the
    search uses that pool's one cost model, already trained on the tasks tuned before;
    with `history`, a pool over `model_tasks` learns all of it first, and the task
    resumes from its own records."""
    backend = cpu_backend(cpu_info(), args.threads)
    tasks = list(model_tasks) if history else [task]
    if strategy == "model" and shared:
        search = shared
    elif strategy in SEARCH_OPTIONS:
        search = LocalSearchPool(tasks, backend, seed, SEARCH_OPTIONS[strategy])
    else:
        search = RandomPool(tasks, backend, seed)
    mine = [r for r in history if r.task_key == task.key]
    if history:
        search.learn([r for r in history if r.task_key != task.key])
    tuner = Tuner([task], "llvm", cpu_info().name, measure_fn(pool, args.threads, args.cold),
                  search, None, mine, TuneOptions(trials=trials + len(mine), batch=8,
                                                  seed=seed, threads=args.threads,
                                                  cold_weights=args.cold))
    tuner.run()
    return curve(tuner, len(mine))


def strategies_from(text: str, known) -> list[str]:
    """The comma-separated strategies of `text`; exits naming any not in `known`."""
    strategies = text.split(",")
    if unknown := set(strategies) - set(known):
        sys.exit(f"unknown strategies {sorted(unknown)}: choose from {tuple(known)}")
    return strategies


def trials_to(curve_: list[float], target: float) -> int:
    return next((i + 1 for i, t in enumerate(curve_) if t <= target), len(curve_) + 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=128)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="resnet18", help="zoo model the tasks come from")
    p.add_argument("--tasks", nargs="+", default=list(TASKS),
                   help="task descriptions (Compute.describe()) of the model's tasks")
    p.add_argument("--strategies", default="model,random",
                   help=f"comma-separated, of {', '.join(STRATEGIES)}")
    p.add_argument("--cold", action="store_true", help="time the weights out of cache")
    p.add_argument("--history", help="records of --model to resume from (see above)")
    p.add_argument("--shared-model", action="store_true",
                   help="tune the tasks one after another with one cost model, as "
                        "tune_network does (tasks teach each other)")
    args = p.parse_args()
    strategies = strategies_from(args.strategies, STRATEGIES)
    torch.set_num_threads(args.threads)
    model, inputs = getattr(zoo, args.model)()
    all_tasks = rk.extract_tasks(model, inputs)
    tasks = [t for t in all_tasks if t.compute.describe() in args.tasks]
    if missing := set(args.tasks) - {t.compute.describe() for t in tasks}:
        sys.exit(f"{args.model} has no tasks {sorted(missing)}")
    history, history_best = [], {}
    if args.history:
        if args.shared_model:
            sys.exit("--history and --shared-model exclude each other")
        with tempfile.TemporaryDirectory() as tmp:
            loaded = load_records(records_file(args.history, tmp)).records
        history = [r for r in loaded
                   if r.target == "llvm" and r.threads == args.threads
                   and r.cold_weights == args.cold]
        if not history:
            sys.exit(f"{args.history} holds no llvm records at {args.threads} threads "
                     f"with{'' if args.cold else 'out'} --cold")
        for t in tasks:
            times = [r.median for r in history if r.task_key == t.key]
            history_best[t.compute.describe()] = {
                "trials": len(times), "best_us": round(min(times, default=math.inf) * 1e6, 1)}
        print(f"history: {len(history)} records; " + "; ".join(
            f"{k}: {v['trials']} trials, best {v['best_us']} us"
            for k, v in history_best.items()), file=sys.stderr, flush=True)
    to95 = {s_: [] for s_ in strategies}
    at = {s_: [] for s_ in strategies}
    finals, best_us, algorithms = [], {}, {}
    with ProcessPoolExecutor(2) as pool:
        backend = cpu_backend(cpu_info(), args.threads)
        shared = {seed: LocalSearchPool(tasks, backend, seed) if args.shared_model else None
                  for seed in range(args.seeds)}
        for task in tasks:
            for seed in range(args.seeds):
                runs = {s_: run(task, s_, args.trials, seed, pool, args, shared[seed],
                                all_tasks, history) for s_ in strategies}
                curves = {s_: c for s_, (c, _) in runs.items()}
                best = min(c[-1] for c in curves.values())
                for s_, c in curves.items():
                    to95[s_].append(trials_to(c, best / 0.95))
                    at[s_].append([c[min(k, len(c)) - 1] for k in CHECKPOINTS])
                if "model" in curves and "random" in curves:
                    finals.append(curves["random"][-1] / curves["model"][-1])
                name = task.compute.describe()
                best_us.setdefault(name, {})[str(seed)] = {
                    s_: round(c[-1] * 1e6, 1) for s_, c in curves.items()}
                algorithms.setdefault(name, {})[str(seed)] = {
                    s_: a for s_, (_, a) in runs.items()}
                print(f"{name:<48} seed {seed}: " + "; ".join(
                    f"{s_} {c[-1] * 1e6:.0f} us ({runs[s_][1]}, to 95% {to95[s_][-1]})"
                    for s_, c in curves.items()), file=sys.stderr, flush=True)
    mean95 = {s_: round(statistics.mean(v), 1) for s_, v in to95.items()}
    out = {"trials_to_95": mean95}
    if "model" in mean95 and "random" in mean95:
        out["trials_ratio"] = round(mean95["model"] / mean95["random"], 3)
    if finals:
        out["final_ratio"] = round(statistics.mean(finals), 3)
    if "model" in strategies:
        model_best = [b_["model"] for seeds in best_us.values() for b_ in seeds.values()]
        out["model_best_geomean_us"] = round(statistics.geometric_mean(model_best), 1)
    out.update({"best_us": best_us, "best_algorithm": algorithms,
                "geomean_us_at_trials": {
                    s_: {str(k): round(statistics.geometric_mean(
                        [row[j] for row in rows]) * 1e6, 1)
                        for j, k in enumerate(CHECKPOINTS)} for s_, rows in at.items()},
                "strategies": strategies, "model": args.model, "tasks": args.tasks,
                "trials_per_task": args.trials, "seeds": args.seeds,
                "threads": args.threads, "shared_model": args.shared_model,
                "cold": args.cold, "history": args.history and pinned(args.history),
                "history_best": history_best,
                "cpu": cpu_info().name})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
