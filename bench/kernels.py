"""Kernel benchmark: bounded random search per ResNet-18 conv task and the dense layer,
against PyTorch's best layout for the same task, with the machine's FMA peak measured in
the same run.

    python bench/kernels.py [--trials 64] [--threads 2] [--model resnet18]

Ours: the best of `trials` random configs (each timed briefly), re-timed with the full
protocol. Torch: the task's reference (conv/linear, then its epilogue ops as eager torch
ops) in NCHW and in channels_last, the faster one. Packing into our layouts is excluded
(the layout ILP accounts for transforms); ratio = torch_us / ours_us.
Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time

import torch

import raytune_kernels as rk
from raytune_kernels import zoo
from raytune_kernels.codegen.build import cpu_info
from raytune_kernels.codegen.kernel import build_candidate, prepare
from raytune_kernels.codegen.peak import measure_peak
from raytune_kernels.codegen.schedules import space_for, unpack, unsupported_reason
from raytune_kernels.measure import random_operands
from raytune_kernels.reference import reference
from raytune_kernels.timing import TimingOptions, median, time_fn

QUICK = TimingOptions(warmup=1, min_repeat_ms=5, repeats=3)
FULL = TimingOptions(warmup=3, min_repeat_ms=40, repeats=7)


def torch_fns(compute, ops) -> list:
    """The task in PyTorch, NCHW and channels_last (the benchmark keeps the faster)."""
    def cl(x):
        return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
    variants = (ops, [cl(x) for x in ops])
    return [lambda v=v: reference(compute, *v) for v in variants]


def interleaved(fns: list, rounds: int = 3) -> list[float]:
    """Median time of each fn, timed in alternation so that load on the machine (a shared
    second core swings 2-thread timings) falls on every candidate alike."""
    times: list[list[float]] = [[] for _ in fns]
    with torch.no_grad():
        for _ in range(rounds):
            for i, fn in enumerate(fns):
                times[i] += time_fn(fn, FULL)
    return [median(t) for t in times]


def search(task, trials: int, threads: int, seed: int):
    space = space_for(task.compute, cpu_info())
    ops = random_operands(task.compute, seed)
    rng, tried, best = random.Random(seed), set(), (math.inf, None, None)
    while len(tried) < min(trials, space.count()):
        cfg = space.sample(rng)
        if cfg in tried:
            continue
        tried.add(cfg)
        nest, built = build_candidate(task.compute, cfg)
        if built.error:
            continue
        prep = prepare(task.compute, cfg, nest, built.library, ops, threads)
        t = median(time_fn(prep.run, QUICK))
        if t < best[0]:
            best = (t, cfg, prep)
    return best, ops


def bench_task(task, trials: int, threads: int, peak: float, seed: int) -> dict:
    start = time.perf_counter()
    (_, cfg, prep), ops = search(task, trials, threads, seed)
    ours, *torch_times = interleaved([prep.run] + torch_fns(task.compute, ops))
    theirs = min(torch_times)
    got = unpack(task.compute, cfg, prep.buffers["out"])
    err = (got - reference(task.compute, *ops)).abs().max().item()
    row = {"key": task.key, "compute": task.compute.describe(), "weight": task.weight,
           "ours_us": round(ours * 1e6, 1), "torch_us": round(theirs * 1e6, 1),
           "ratio": round(theirs / ours, 3),
           "pct_peak": round(100 * task.flops / ours / 1e9 / peak, 1),
           "max_abs_err": err, "config": cfg.to_json(),
           "search_s": round(time.perf_counter() - start, 1)}
    print(f"{row['compute']:<48} ours {row['ours_us']:>8.1f} us  torch {row['torch_us']:>8.1f}"
          f" us  x{row['ratio']:.2f}  {row['pct_peak']:5.1f}% peak  err {err:.1e} "
          f"{cfg.get('algorithm', '')}",
          file=sys.stderr, flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="only the first N tasks")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, inputs = zoo.load(args.model)
    tasks = [t for t in rk.extract_tasks(model, inputs) if t.compute.op in ("conv2d", "dense")
             and unsupported_reason(t.compute) is None]
    tasks = tasks[: args.limit] if args.limit else tasks
    peak = max(measure_peak(args.threads, FULL) for _ in range(3))  # a capability: best of 3
    print(f"FMA peak on {args.threads} threads: {peak:.1f} GFLOP/s", file=sys.stderr)
    rows = [bench_task(t, args.trials, args.threads, peak, args.seed + i)
            for i, t in enumerate(tasks)]
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    print(json.dumps({"model": args.model, "tasks": rows, "geomean_ratio": round(geo, 3),
                      "peak_gflops": round(peak, 1), "threads": args.threads,
                      "trials": args.trials, "cpu": cpu_info().name,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
