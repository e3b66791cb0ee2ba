"""A simulated GPU cluster fed by the real head, on this machine: trials per second, measurer
busy fraction and head CPU per trial with N = 1, 8, 32 and 64 GPU measurers.

    python bench/scale.py [--gpus 1 8 32 64] [--trials-per-gpu 60] [--mean-s 0.2]
                          [--plot bench/results/znver5/scale.png]

The head is the real one: the Tuner streaming rounds (Tuner.stream), its task scheduler,
one evolutionary search per task with the shared XGBoost cost model (LocalSearchPool, CUDA
features for sm_90), the records writer and the dashboard metrics, tuning ResNet-18's CUDA
tasks. The devices are simulated: a Ray actor stands for one node of up to 8 GPUs (asyncio:
one process holds the node's GPUs), with `--builders-per-gpu` build slots per GPU.
A build sleeps for a draw of NVRTC's compile times, measured here on kernels rendered
from the tasks' own configs; a measurement sleeps for a draw of the GPU's: the per-trial
`run_s` of the H100 records in bench/results/h100-80gb-hbm3/, scaled so that their mean
is `--mean-s` (0.2 s: N GPUs then measure at most 5 N trials per second; the records' own
times are skewed, so the median comes out near 0.18 s). The kernel time a measurement
returns is synthetic (log-additive in the knob values, so the cost model has something to
learn): this benchmark is about the head's throughput, not the search's quality
(bench/search.py).

Per N: trials/s (trials over the wall time from the first launch to the last result),
busy fraction (the simulated GPUs' summed measuring time over N x wall), both also in
the steady state (`steady`: between the 10th and 90th percentile of the measurements'
ends, without the run's start and drain), head CPU seconds per trial (this process's CPU
time: everything the head does, Ray's client included; with `--search-actors`, the
actors' too), the search's share of it (preparing, proposing, learning), proposal
latency (median and 95th percentile of the pool's proposal calls, ms; search actors make
one call for the rounds of all free places), the machine's CPU use, and the records
checked: every trial launched is in the records file exactly once (`lost`,
`duplicates`). Before the first round the head prepares every task's search (its
initial pool analysed: search.prepare); that CPU counts in the head's. Last line: one
JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import math
import os
import pathlib
import random
import shlex
import statistics
import sys
import tempfile
import time

import numpy as np
import ray

import raytune_kernels as rk
from raytune_kernels import zoo
from raytune_kernels.backend import cuda_backend
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cuda.gpu import gpu_info
from raytune_kernels.measure import MeasureResult
from raytune_kernels.space import Config
from raytune_kernels.tune.callbacks import Callback
from raytune_kernels.tune.records import RecordWriter, config_key, load_records
from raytune_kernels.tune.search import SearchOptions
from raytune_kernels.tune.tuner import LocalSearchPool, TuneOptions, Tuner

from actors.metrics import TuningMetrics

H100 = pathlib.Path(__file__).resolve().parent / "results" / "h100-80gb-hbm3"
ARCH = "sm_90"
GPUS_PER_NODE = 8


def gpu_times(mean_s: float) -> tuple[list[float], dict]:
    """The H100 records' per-trial measuring times, scaled to a mean of `mean_s`."""
    lines = [json.loads(line) for f in sorted(H100.glob("*.jsonl"))
             for line in f.read_text().splitlines() if line.strip()]
    runs = [r["run_s"] for r in lines if "run_s" in r]  # records; not the check's lines
    if not runs:
        sys.exit(f"no H100 records with run_s under {H100}")
    scale = mean_s / statistics.mean(runs)
    times = [t * scale for t in runs]
    return times, {"source": f"run_s of {len(runs)} H100 records ({H100.name}), x{scale:.2f}",
                   "h100_median_s": round(statistics.median(runs), 4),
                   "mean_s": round(statistics.mean(times), 4), **_summary(times)}


def nvrtc_times(tasks, backend, n: int) -> tuple[list[float], dict]:
    """NVRTC's compile seconds of `n` kernels rendered from random configs of the tasks."""
    from raytune_kernels.cuda.build import build_cuda, nvrtc_unavailable

    reason = nvrtc_unavailable()
    if reason:
        sys.exit(f"NVRTC is needed to time builds: {reason}")
    rng, times = random.Random(0), []
    for i in range(n):
        task = tasks[i % len(tasks)]
        built = build_cuda(task.compute, backend.space(task.compute).sample(rng), ARCH)
        times.append(built.seconds)
    return times, {"source": f"NVRTC compiles of {n} rendered kernels on this CPU",
                   **_summary(times)}


def _summary(times: list[float]) -> dict:
    q = np.percentile(times, [10, 50, 90])
    return {"p10_s": round(float(q[0]), 4), "median_s": round(float(q[1]), 4),
            "p90_s": round(float(q[2]), 4)}


def kernel_seconds(task_key: str, config: dict) -> float:
    """A synthetic kernel time: 100 us divided by a factor in [0.5, 1] per knob value."""
    factor = 1.0
    for name, value in sorted(config.items()):
        digest = hashlib.blake2b(f"{task_key}:{name}={value}".encode(), digest_size=8).digest()
        factor *= 0.5 + 0.5 * int.from_bytes(digest, "little") / 2 ** 64
    return 1e-4 / factor


@ray.remote(num_cpus=0)
class SimNode:
    """A node of `gpus` simulated GPUs and `builders` build slots. A round's candidates
    are built as slots free up and measured as GPUs free up, in the order they come."""

    def __init__(self, gpus: int, builders: int, build_s: list[float],
                 measure_s: list[float], seed: int):
        self.gpus, self.builders = gpus, builders
        self.build_s, self.measure_s = build_s, measure_s
        self.rng = random.Random(seed)
        self.spans: list[tuple[float, float]] = []  # (start, end) of every measurement

    async def ready(self) -> int:
        self._gpu = asyncio.Semaphore(self.gpus)
        self._build = asyncio.Semaphore(self.builders)
        return os.getpid()

    async def run(self, items: list[tuple[str, dict]]) -> list[dict]:
        return list(await asyncio.gather(*(self._trial(k, c) for k, c in items)))

    async def _trial(self, task_key: str, config: dict) -> dict:
        build = self.rng.choice(self.build_s)
        async with self._build:
            await asyncio.sleep(build)
        run = self.rng.choice(self.measure_s)
        async with self._gpu:
            start = time.monotonic()  # one clock for every process of this machine
            await asyncio.sleep(run)
            self.spans.append((start, time.monotonic()))
        t = kernel_seconds(task_key, config)
        return MeasureResult((t, t * 1.01, t * 0.99), build_s=build, run_s=run).to_json()

    def measured(self) -> list[tuple[float, float]]:
        return self.spans


class Cluster:
    """The simulated nodes, and Tuner.stream's launch and wait over them: a round goes
    to the node with the fewest trials in flight per GPU."""

    def __init__(self, gpus: int, builders_per_gpu: int, build_s, measure_s):
        sizes = [min(GPUS_PER_NODE, gpus - i) for i in range(0, gpus, GPUS_PER_NODE)]
        self.sizes = sizes
        self.nodes = [SimNode.remote(g, g * builders_per_gpu, build_s, measure_s, i)
                      for i, g in enumerate(sizes)]
        ray.get([n.ready.remote() for n in self.nodes])
        self.load = [0] * len(sizes)
        self.flight: dict = {}  # ObjectRef -> (node, trials)
        self.launched: list[tuple[str, str]] = []  # (task key, config key) of every trial
        self.first = self.last = None

    def launch(self, items) -> object:
        k = min(range(len(self.nodes)), key=lambda j: self.load[j] / self.sizes[j])
        ref = self.nodes[k].run.remote([(t.key, c.to_json()) for t, c in items])
        self.flight[ref] = (k, len(items))
        self.load[k] += len(items)
        self.launched += [(t.key, config_key(c.to_json())) for t, c in items]
        self.first = self.first or time.monotonic()
        return ref

    def wait(self, refs: list) -> list:
        done, rest = ray.wait(refs, num_returns=1)
        if rest:
            done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        out = []
        for ref in done:
            k, n = self.flight.pop(ref)
            self.load[k] -= n
            out.append((ref, [MeasureResult.from_json(r) for r in ray.get(ref)]))
        self.last = time.monotonic()
        return out

    def spans(self) -> list[tuple[float, float]]:
        """(start, end) of every measurement on every node."""
        return [s for spans in ray.get([n.measured.remote() for n in self.nodes])
                for s in spans]

    def shutdown(self) -> None:
        for n in self.nodes:
            ray.kill(n)


class TimedPool:
    """The search pool, its proposals' wall times and the CPU seconds of its processes:
    this one's (proposals, learning), and the search and cost model actors' where the
    pool has them (RaySearchPool)."""

    def __init__(self, pool):
        self.pool, self.latencies, self.cpu_s, self.rounds = pool, [], 0.0, 0
        self.actor_pids = pool.pids() if hasattr(pool, "pids") else []
        if hasattr(pool, "propose_many"):
            self.propose_many = self._propose_many

    def propose(self, key: str, n: int) -> list[Config]:
        wall, cpu = time.perf_counter(), time.process_time()
        out = self.pool.propose(key, n)
        self.rounds += 1
        self.latencies.append(time.perf_counter() - wall)
        self.cpu_s += time.process_time() - cpu
        return out

    def _propose_many(self, asks):
        wall, cpu = time.perf_counter(), time.process_time()
        out = self.pool.propose_many(asks)
        self.rounds += len(asks)
        self.latencies.append(time.perf_counter() - wall)
        self.cpu_s += time.process_time() - cpu
        return out

    def actors_cpu_s(self) -> float:
        """CPU seconds the actors' processes have used so far (/proc)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self.actor_pids:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return total

    def learn(self, records) -> None:
        cpu = time.process_time()
        self.pool.learn(records)
        self.cpu_s += time.process_time() - cpu

    def observe(self, key, cfgs, seconds) -> None:
        self.pool.observe(key, cfgs, seconds)

    def exhausted(self, key: str) -> bool:
        return self.pool.exhausted(key)

    def unseeded(self, key, measured) -> bool:
        return self.pool.unseeded(key, measured)


class Metrics(Callback):
    """The dashboard metrics of every round, as the scheduler actor records them."""

    def __init__(self):
        self.metrics, self.tuner = TuningMetrics(), None

    def on_round(self, summary) -> None:
        self.metrics.observe(summary, self.tuner.last)

    def on_end(self, result) -> None:
        self.metrics.flush()


def cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat)."""
    fields = [float(v) for v in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def run_n(gpus: int, tasks, backend, args, build_s, measure_s) -> dict:
    """Tune `tasks` on `gpus` simulated GPUs with the real head; the figures of the run."""
    cluster = Cluster(gpus, args.builders_per_gpu, build_s, measure_s)
    trials = max(args.min_trials, args.trials_per_gpu * gpus)
    depth = max(2, math.ceil(args.in_flight * gpus / args.batch))
    path = os.path.join(tempfile.mkdtemp(prefix="rk-scale-"), "records.jsonl")
    writer = RecordWriter(path)
    pool, metrics = TimedPool(search_pool(tasks, backend, args.search_actors)), Metrics()
    tuner = Tuner(tasks, f"cuda -arch={ARCH}", "simulated H100", _no_measure, pool, writer,
                  [], TuneOptions(trials=trials, batch=args.batch))
    metrics.tuner = tuner
    cpu0, actors0, busy0 = time.process_time(), pool.actors_cpu_s(), cpu_busy()
    pool.pool.prepare()  # before the first round, as a head does (search.prepare)
    prepare_here = time.process_time() - cpu0  # the actors' part counts in actors_cpu
    prepare_cpu = prepare_here + pool.actors_cpu_s() - actors0
    tuner.stream(cluster.launch, cluster.wait, depth, [metrics])
    writer.close()
    actors_cpu = pool.actors_cpu_s() - actors0
    head_cpu, busy1 = time.process_time() - cpu0 + actors_cpu, cpu_busy()
    wall, spans = cluster.last - cluster.first, cluster.spans()
    cluster.shutdown()
    lat, n = np.asarray(pool.latencies) * 1e3, tuner.spent
    out = {"trials": n, "wall_s": round(wall, 2), "trials_per_s": round(n / wall, 1),
           "busy_fraction": round(busy_within(spans, cluster.first, cluster.last)
                                  / (gpus * wall), 3),
           "steady": steady_state(spans, gpus),
           "head_cpu_s_per_trial": round(head_cpu / n, 5),
           "search_cpu_s_per_trial": round((pool.cpu_s + prepare_here + actors_cpu) / n, 5),
           "search_actors": args.search_actors,
           "prepare_cpu_s": round(prepare_cpu, 2),
           "proposal_ms": {"median": round(float(np.median(lat)), 2),
                           "p95": round(float(np.percentile(lat, 95)), 2),
                           "calls": len(lat), "rounds": pool.rounds},
           "machine_cpu_use": round((busy1[0] - busy0[0]) / (busy1[1] - busy0[1]), 3),
           "rounds_in_flight": depth, **check_records(path, cluster.launched)}
    print(describe(gpus, out), file=sys.stderr, flush=True)
    return out


def search_pool(tasks, backend, actors: int):
    """The head's searches and cost model: in this process (0), or in `actors` search
    actors spread by Ray and a cost model actor (actors/tuning_actors.RaySearchPool)."""
    if not actors:
        return LocalSearchPool(tasks, backend, 0)
    from actors.tuning_actors import RaySearchPool

    return RaySearchPool(tasks, backend, 0, SearchOptions(), num_search=actors, spread=True)


def check_records(path: str, launched: list[tuple[str, str]]) -> dict:
    """Records in the file, and launched trials missing from it or there twice."""
    seen = collections.Counter((r.task_key, r.config_key()) for r in load_records(path).records)
    sent = collections.Counter(launched)
    return {"records": sum(seen.values()), "lost": sum(1 for k in sent if k not in seen),
            "duplicates": sum(n - 1 for n in seen.values()) + sum(n - 1 for n in sent.values())}


def describe(gpus: int, out: dict) -> str:
    steady = out["steady"]
    return (f"{gpus:>3} GPUs: {out['trials']} trials in {out['wall_s']:.1f} s, "
            f"{out['trials_per_s']} trials/s, GPUs busy {out['busy_fraction']:.0%} (steady: "
            f"{steady['trials_per_s']} trials/s, {steady['busy_fraction']:.0%}), head "
            f"{out['head_cpu_s_per_trial'] * 1e3:.2f} ms CPU/trial (search "
            f"{out['search_cpu_s_per_trial'] * 1e3:.2f}), proposal "
            f"{out['proposal_ms']['median']:.1f} ms median, machine CPU "
            f"{out['machine_cpu_use']:.0%}, lost {out['lost']}, duplicates {out['duplicates']}")


def busy_within(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Measuring seconds of `spans` inside [start, end]."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


def steady_state(spans: list[tuple[float, float]], gpus: int) -> dict:
    """Trials/s and busy fraction between the 10th and the 90th percentile of the
    measurements' ends: the run without its start (the first rounds proposed before
    anything is learnt) and its end (the last rounds drained, no more proposed)."""
    ends = sorted(b for _, b in spans)
    lo, hi = ends[len(ends) // 10], ends[len(ends) * 9 // 10]
    if hi <= lo:
        return {"trials_per_s": 0.0, "busy_fraction": 0.0}
    done = sum(1 for e in ends if lo < e <= hi)
    return {"trials_per_s": round(done / (hi - lo), 1),
            "busy_fraction": round(busy_within(spans, lo, hi) / (gpus * (hi - lo)), 3)}


def _no_measure(items):
    raise RuntimeError("bench/scale.py measures through Tuner.stream only")


def plot(results: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    ns = sorted(results, key=int)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([int(n) for n in ns], [results[n]["trials_per_s"] for n in ns], "o-",
            label="whole run")
    ax.plot([int(n) for n in ns], [results[n]["steady"]["trials_per_s"] for n in ns], "s--",
            label="steady state")
    ax.plot([int(n) for n in ns], [int(n) / results[n]["measure_mean_s"] for n in ns], ":",
            label="N / mean measuring time")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("simulated GPU measurers (N)")
    ax.set_ylabel("trials / s")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--trials-per-gpu", type=int, default=60)
    p.add_argument("--min-trials", type=int, default=120)
    p.add_argument("--mean-s", type=float, default=0.2, help="mean measuring time")
    p.add_argument("--builders-per-gpu", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--in-flight", type=float, default=8.0,
                   help="trials in flight per GPU (building, queued, measuring)")
    p.add_argument("--builds", type=int, default=12, help="NVRTC compiles to time")
    p.add_argument("--search-actors", type=int, default=0,
                   help="0: searches and cost model in the head process; K: K search "
                        "actors (proposing a stream's rounds in parallel) and a cost model "
                        "actor, whose CPU counts in the head's")
    p.add_argument("--plot", help="write a PNG of trials/s against N here")
    args = p.parse_args()
    if min(args.gpus) < 1:
        p.error("--gpus takes positive counts")
    import xgboost  # noqa: F401  (imported once by the head process, before any round)

    model, inputs = zoo.resnet18()
    backend = cuda_backend(gpu_info(ARCH))
    tasks = [t for t in rk.extract_tasks(model, inputs) if backend.unsupported(t.compute) is None]
    measure_s, measure_info = gpu_times(args.mean_s)
    build_s, build_info = nvrtc_times(tasks, backend, args.builds)
    print(f"measuring: {measure_info}\nbuilding: {build_info}", file=sys.stderr)
    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    results = {}
    for n in args.gpus:
        results[str(n)] = run_n(n, tasks, backend, args, build_s, measure_s)
        results[str(n)]["measure_mean_s"] = measure_info["mean_s"]
    ray.shutdown()
    if args.plot:
        plot(results, args.plot)
    keyed = {k: {n: r[k] for n, r in results.items()}
             for k in ("trials_per_s", "busy_fraction", "steady", "head_cpu_s_per_trial",
                       "search_cpu_s_per_trial", "proposal_ms", "machine_cpu_use")}
    command = shlex.join(["bench/scale.py", "--gpus", *map(str, args.gpus),
                          "--trials-per-gpu", str(args.trials_per_gpu),
                          "--mean-s", str(args.mean_s), "--in-flight", str(args.in_flight),
                          "--search-actors", str(args.search_actors)])
    print(json.dumps({"bench": "scale", "command": command, **keyed,
                      "lost": sum(r["lost"] for r in results.values()),
                      "duplicates": sum(r["duplicates"] for r in results.values()),
                      "runs": results, "tasks": len(tasks), "batch": args.batch,
                      "gpus_per_node": GPUS_PER_NODE, "builders_per_gpu": args.builders_per_gpu,
                      "measure_s": measure_info, "build_s": build_info,
                      "cores": len(os.sched_getaffinity(0)), "cpu": cpu_info().name}))


if __name__ == "__main__":
    main()
