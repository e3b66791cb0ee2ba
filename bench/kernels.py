"""Kernel benchmark: bounded random search per ResNet-18 conv task and the dense layer,
against PyTorch's best layout for the same task, with the machine's FMA peak measured in
the same run.

    python bench/kernels.py [--trials 64] [--threads 2] [--model resnet18]
    python bench/kernels.py --target cuda [--trials 64] [--limit N] [--records FILE]
    python bench/kernels.py --target "cuda -arch=sm_90" ...
    python bench/kernels.py --target cuda --precision fp16 ...   # or "cuda -precision=fp16"

Ours: the best of `trials` random configs (each timed briefly), re-timed with the full
protocol. Torch: the task's reference (conv/linear, then its epilogue ops as eager torch
ops) in NCHW and in channels_last, the faster one. Packing into our layouts is excluded
(the layout ILP accounts for transforms); ratio = torch_us / ours_us.

With a cuda target the same tasks (those with a CUDA kernel) are tuned by the tuner itself
(tune_tasks: GPU measurers and NVRTC builders through Ray, `trials` per task on average,
the cost model guiding) in the target's precision (--precision or the target's
-precision=; fp32 by default), then ours (the best record's kernel, rebuilt and re-checked)
and torch in the same precision (on the GPU, cudnn.benchmark on; fp32 with TF32 off, tf32
with it on, fp16 and bf16 on operands cast to that type) are timed alike in this process:
warm-up, CUDA events, each repeat's calls replayed from one CUDA graph (a kernel's time,
not the rate at which Python launches it), the L2 flushed before each repeat, the median
of repeats, interleaved round by round (raytune_kernels.cuda.torch_timing). Without a visible CUDA
GPU: exit status 2. Last line of stdout: one JSON object (naming the device, the target
and the precision).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch

import raytune_kernels as rk
from raytune_kernels import zoo
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.kernel import build_candidate, prepare
from raytune_kernels.cpu.peak import measure_peak
from raytune_kernels.cpu.schedules import space_for, unpack, unsupported_reason
from raytune_kernels.measure import MeasureOptions, random_operands
from raytune_kernels.frontend.reference import reference
from raytune_kernels.precision import PRECISIONS
from raytune_kernels.target import target_arg
from raytune_kernels.timing import TimingOptions, median, time_fn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from network import with_precision  # noqa: E402  (bench/ is no package)

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


# ------------------------------------------------------------------------------ cuda

# the records' protocol (cuda/measure.py, flush_cache), with more warm-up and repeats
GPU_FULL = MeasureOptions(warmup=10, min_repeat_ms=20, repeats=7, flush_cache=True)


def cuda_tasks(model_name: str, target, limit: int) -> list:
    from raytune_kernels.cuda.render import cuda_unsupported_reason

    model, inputs = zoo.load(model_name)
    tasks = [t for t in rk.extract_tasks(model, inputs, target=target)
             if t.compute.op in ("conv2d", "dense") and cuda_unsupported_reason(t.compute) is None]
    return tasks[:limit] if limit else tasks


# how PyTorch is run for each precision of ours, in words for the table's header
TORCH_MODES = {"fp32": "fp32 with TF32 off", "tf32": "fp32 with TF32 on",
               "fp16": "float16 operands", "bf16": "bfloat16 operands"}


def torch_gpu_fns(compute, seed: int, precision: str = "fp32", device: str = "cuda") -> dict:
    """The task in PyTorch on the GPU in `precision`, NCHW and channels_last, on the
    operands our kernel is measured with (random_operands with the same seed), cast to
    that precision's type (fp16, bf16); keys name the layout and the precision. Time them
    inside precision_mode(precision) (TF32 on for tf32)."""
    from raytune_kernels.cuda.torch_timing import DTYPES

    dtype = DTYPES[precision]
    ops = [x.to(device, dtype) if x.is_floating_point() else x.to(device)
           for x in random_operands(compute, seed)]
    names = (f"NCHW {precision}", f"channels_last {precision}")
    return dict(zip(names, torch_fns(compute, ops)))


def bench_task_cuda(task, record, rounds: int, precision: str) -> dict:
    from raytune_kernels.cuda.build import build_cuda
    from raytune_kernels.space import Config
    from raytune_kernels.cuda.measure import measure_built_gpu
    from raytune_kernels.target import parse_target
    from raytune_kernels.cuda.torch_timing import time_torch_gpu

    row = {"key": task.key, "compute": task.compute.describe(), "weight": task.weight}
    if record is None:
        return {**row, "error": "no valid record: every tuned candidate failed"}
    cfg = Config.from_json(record.config)
    built = build_cuda(task.compute, cfg, parse_target(record.target).arch)
    if built.error:
        return {**row, "error": f"rebuild failed: {built.error}"[:300]}
    fns = torch_gpu_fns(task.compute, GPU_FULL.seed, precision)
    ours, theirs = [], {k: [] for k in fns}
    for _ in range(rounds):  # alternated, so that drift falls on both alike
        res = measure_built_gpu(task.compute, cfg, built.cubin or built.ptx, GPU_FULL)
        if not res.ok:  # checked against the reference before any timing
            return {**row, "error": f"{res.error_kind}: {res.error_msg}"[:300]}
        ours.append(res.median)
        for k, fn in fns.items():
            try:
                theirs[k].append(median(time_torch_gpu(fn, GPU_FULL.timing(), True,
                                                       precision=precision, graphed=True)))
            except Exception as exc:  # PyTorch without this op in this type: the row says so
                return {**row, "error": f"torch {k}: {type(exc).__name__}: {exc}"[:300]}
    ours_s = median(ours)
    best_layout = min(theirs, key=lambda k: median(theirs[k]))
    torch_s = median(theirs[best_layout])
    return {**row, "ours_us": round(ours_s * 1e6, 2), "record_us": round(record.median * 1e6, 2),
            "torch_us": round(torch_s * 1e6, 2), "torch_layout": best_layout,
            "ratio": round(torch_s / ours_s, 3),
            "tflops": round(task.flops / ours_s / 1e12, 2), "config": record.config}


def print_row_cuda(row: dict) -> None:
    if "error" in row:
        print(f"{row['compute']:<48} {row['error']}", file=sys.stderr, flush=True)
        return
    print(f"{row['compute']:<48} ours {row['ours_us']:>8.2f} us  torch {row['torch_us']:>8.2f}"
          f" us ({row['torch_layout']})  x{row['ratio']:.2f}  {row['tflops']:6.2f} TFLOP/s  "
          f"record {row['record_us']:.2f} us", file=sys.stderr, flush=True)


def main_cuda(args) -> int:
    """The cuda benchmark; 2 with a one-line message when it cannot run here."""
    from raytune_kernels.errors import RaytuneError
    from raytune_kernels.cuda.torch_timing import require_gpu

    try:
        gpu = require_gpu(f"--target {str(args.target)!r}")
        return bench_cuda(args, gpu)
    except RaytuneError as exc:  # no GPU here, none in Ray, no NVRTC, an arch mismatch
        print(f"bench/kernels.py: error: {exc}", file=sys.stderr)
        return 2


def bench_cuda(args, gpu: str) -> int:
    import ray

    target, precision = str(args.target), args.target.precision
    tasks = cuda_tasks(args.model, args.target, args.limit)
    print(f"tuning {len(tasks)} {args.model} conv/dense tasks for target {target!r} on {gpu}: "
          f"{args.trials * len(tasks)} trials", file=sys.stderr, flush=True)
    start = time.perf_counter()
    tuned = rk.tune_tasks(tasks, target=target, trials=args.trials * len(tasks),
                          records=args.records, seed=args.seed, verbose=False)
    tune_s = time.perf_counter() - start
    ray.shutdown()  # nothing of Ray's on the GPU while we time
    rec_targets = sorted({r.target for r in tuned.best.values()})
    print(f"{args.model} kernels on {gpu}, target {target!r} (records: "
          f"{', '.join(rec_targets) or 'none'}), tuned {tuned.trials} trials in {tune_s:.0f} s; "
          f"torch in {TORCH_MODES[precision]}, cudnn.benchmark on; CUDA events, L2 flushed "
          "per repeat",
          file=sys.stderr, flush=True)
    rows = []
    for task in tasks:
        rows.append(bench_task_cuda(task, tuned.best.get(task.key), args.rounds, precision))
        print_row_cuda(rows[-1])
    ok = [r for r in rows if "ratio" in r]
    geo = math.exp(sum(math.log(r["ratio"]) for r in ok) / len(ok)) if ok else None
    print(json.dumps({"model": args.model, "target": target, "precision": precision,
                      "record_targets": rec_targets, "device": gpu, "tasks": rows,
                      "geomean_ratio": round(geo, 3) if geo else None,
                      "failed": len(rows) - len(ok), "trials": tuned.trials,
                      "trials_per_task": args.trials, "tune_s": round(tune_s, 1),
                      "cudnn_benchmark": True,
                      "torch": torch.__version__, "torch_cuda": torch.version.cuda}))
    return 0


# ------------------------------------------------------------------------------- main

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--target", type=target_arg, default="llvm",
                   help="llvm (default: this CPU, random search), cuda (this machine's GPU) "
                        "or 'cuda -arch=sm_XY' (tuned by the tuner on the GPU)")
    p.add_argument("--trials", type=int, default=64, help="per task (on average for cuda)")
    p.add_argument("--threads", type=int, default=2, help="CPU only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="only the first N tasks")
    p.add_argument("--records", default=None,
                   help="cuda only: a records file, resumed (default: none kept)")
    p.add_argument("--rounds", type=int, default=3,
                   help="cuda only: interleaved timing rounds per task")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="cuda only: the kernels' arithmetic, PyTorch's too (default: the "
                        "target's -precision, else fp32)")
    args = p.parse_args(argv)
    try:
        args.target = with_precision(args.target, args.precision)
    except ValueError as exc:
        p.error(str(exc))  # a usage error: exit status 2
    return args


def main() -> None:
    args = parse_args()
    if args.target.kind == "cuda":
        sys.exit(main_cuda(args))
    if args.target.mcpu:
        print(f"bench/kernels.py: error: --target {str(args.target)!r}: the CPU benchmark "
              "runs on this machine's own CPU; drop -mcpu", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    model, inputs = zoo.load(args.model)
    tasks = [t for t in rk.extract_tasks(model, inputs) if t.compute.op in ("conv2d", "dense")
             and unsupported_reason(t.compute) is None]
    tasks = tasks[: args.limit] if args.limit else tasks
    cpu = cpu_info()
    peak = max(measure_peak(args.threads, cpu.lanes[0], cpu.regs, FULL) for _ in range(3))
    print(f"FMA peak on {args.threads} threads: {peak:.1f} GFLOP/s", file=sys.stderr)
    rows = [bench_task(t, args.trials, args.threads, peak, args.seed + i)
            for i, t in enumerate(tasks)]
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    print(json.dumps({"model": args.model, "tasks": rows, "geomean_ratio": round(geo, 3),
                      "peak_gflops": round(peak, 1), "threads": args.threads,
                      "trials": args.trials, "cpu": cpu.name, "machine": cpu.machine.to_json(),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
