"""Coverage benchmark: does every torchvision classifier run through us, untuned?

    python bench/coverage.py [--threads 1] [--max-gflops 30] [--only NAME ...] [--jobs 2]
                             [--zoo torchvision|timm|hf|all] [--timeout 600] [--rounds 5]
                             [--no-onnx] [--tune MODEL ... [--trials 1000] [--tune-threads 2]]

For each model (random weights, batch 1, 224x224; inception_v3 299x299; text models token
ids of length 128; bench/models.py builds them and makes torchvision importable beside the
CPU torch), in a process of its own with an empty cache directory of its own (no kernel
library or transform timing from an earlier model: a cold compile), so one model that
crashes or hangs costs only itself:

1. capture it (islands allowed) and count the islands by op;
2. compile_network with no records, timed (compile_s, cold): every task runs the analytic
   estimate's best config, untuned; a task no kernel fits runs PyTorch's kernel; islands
   run PyTorch;
3. check it against eager on a new input: the largest difference over the output's scale
   (compile_network's own measure), correct when <= 1e-3;
4. the share of the model's FLOPs in our kernels: FLOPs of the tasks our kernels run, over
   those plus the FLOPs of tasks run by PyTorch and of islands (counted by
   torch.utils.flop_counter while the island runs on its example values);
5. the untuned network's latency against eager PyTorch's and ONNX Runtime's (the model
   exported to ONNX, all graph optimisations, checked against eager first; bench/network.py's
   engine_variants) at the same threads, in this process, interleaved: --rounds rounds,
   each timing every variant once (median of repeats) in an order that rotates by round;
   the ratios are taken per round (eager / ours, onnxruntime / ours: above 1, ours is
   faster) and reported as their median with the lowest and highest.

Models over --max-gflops GFLOPs are skipped for time and listed. Each model's row is
printed as it completes; the last line of stdout is one JSON object: {"cpu", "threads",
"models", "captured", "compiled_and_correct", "no_island", "flops_in_our_kernels"
(median share), "islands" {op: [models]}, "skipped", "failed" {model: reason},
"untuned_vs_eager" and "untuned_vs_onnxruntime" (medians over models of each model's median
per-round ratio), "compile_s" (median over models, cold), "rows", "tuned"
{model: speedup_vs_best_torch, ours_ms, torch_ms, trials, threads} for the --tune models
(bench/network.py, records resumed)}.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

QUICK_TOL = 1e-3  # compile_network's default limit on the scaled error


def measure_one(name: str, threads: int, max_gflops: float, rounds: int = 5,
                onnx: bool = True) -> dict:
    """Everything the benchmark reports for one model, in this process."""
    import torch

    import models
    from raytune_kernels.compile.api import compile_network
    from raytune_kernels.compile.report import scaled_error, worst
    from raytune_kernels.frontend.island import ISLAND
    from raytune_kernels.frontend.partition import run_steps
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(threads)
    row: dict = {"model": name}
    model, inputs = models.all_models()[name]()
    row["gflops"] = round(models.gflops(model, inputs), 3)
    if row["gflops"] > max_gflops:
        row["status"] = "skipped"
        return row
    engine = onnxruntime_engine(model, inputs, threads) if onnx else {}
    ort = engine.pop("onnxruntime", None)
    row.update(engine)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            net = compile_network(model, inputs, None, threads=threads, check=False)
        except Exception as exc:  # a refusal is a result: name it
            row.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:300])
            return row
    row["compile_s"] = round(time.perf_counter() - start, 2)
    graph = net.part.graph
    islands = [n for n in graph.nodes if n.op == ISLAND]
    row["islands"] = sorted({n.attr("what") for n in islands})
    row["island_count"] = len(islands)
    new = tuple(torch.randint_like(x, 0, 100) if not x.is_floating_point()
                else torch.randn_like(x) for x in inputs)
    with torch.no_grad():
        want, got = model(*new), net(*new)
    gots, wants = _tensors(got), _tensors(want)
    row["error"] = worst(scaled_error(g, w) for g, w in zip(gots, wants)) \
        if len(gots) == len(wants) and wants else math.nan  # nothing compared is not correct
    row["correct"] = bool(row["error"] <= QUICK_TOL)
    # FLOPs: our kernels' tasks, PyTorch's tasks, islands (counted as they run)
    flops = {t.key: t.compute.flops() for t in net.part.tasks}
    ours = sum(flops[s.key] for s in net.steps if s.kind == "kernel" and s.key)
    theirs = sum(flops[s.key] for s in net.steps if s.kind == "torch" and s.key)
    env = run_steps(net.part, inputs)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        for n in islands:
            n.attr("fn")(*(env[v] for v in n.inputs))
    theirs += counter.get_total_flops()
    row["flops_in_our_kernels"] = ours / max(ours + theirs, 1)
    row.update(timed(net, model, inputs, rounds, ort), status="ok")
    return row


def onnxruntime_engine(model, inputs, threads: int) -> dict:
    """{"onnxruntime": a zero-argument run of the exported model, "onnxruntime_version"},
    or {"onnxruntime_missing": why not} (bench/network.py's engine_variants: checked
    against eager first)."""
    import network

    with tempfile.TemporaryDirectory(prefix="rk_coverage_onnx_") as work, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engines, versions, missing = network.engine_variants(model, inputs, threads, work)
    if "onnxruntime" not in engines:
        return {"onnxruntime_missing": missing.get("onnxruntime", "not installed")}
    return {"onnxruntime": engines["onnxruntime"],
            "onnxruntime_version": versions["onnxruntime"]}


def timed(net, model, inputs, rounds: int, onnxruntime=None) -> dict:
    """Ours, eager and ONNX Runtime (`onnxruntime`, when given), interleaved round by
    round: each one's median over rounds (ms) and the per-round ratios' median, lowest
    and highest."""
    import torch

    import network
    from raytune_kernels.timing import TimingOptions, median, time_fn

    fns = {"ours": lambda: net(*inputs), "eager": lambda: model(*inputs)}
    if onnxruntime is not None:
        fns["onnxruntime"] = onnxruntime
    out: dict = {}
    opts = TimingOptions(warmup=2, min_repeat_ms=100, repeats=3)
    times: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        for r in range(rounds):
            for k in network.rotated(list(fns), r):
                times[k].append(median(time_fn(fns[k], opts)))
    for k, ts in times.items():
        out[f"{k}_ms"] = round(median(ts) * 1e3, 3)
    for other in ("eager", "onnxruntime"):
        if other in times:
            ratios = [t / o for t, o in zip(times[other], times["ours"])]
            out[f"untuned_vs_{other}"] = round(median(ratios), 3)
            out[f"untuned_vs_{other}_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    out["rounds"] = rounds
    return out


def _tensors(values) -> list:
    import torch
    from torch.utils import _pytree as pytree

    return [v for v in pytree.tree_flatten(values)[0] if isinstance(v, torch.Tensor)]


def run_one(name: str, args) -> dict:
    """One model in a child process with an empty cache directory, bounded by --timeout."""
    cmd = [sys.executable, __file__, "--child", name, "--threads", str(args.threads),
           "--max-gflops", str(args.max_gflops), "--rounds", str(args.rounds)]
    cmd += ["--no-onnx"] if args.no_onnx else []
    try:
        with tempfile.TemporaryDirectory(prefix="rk_coverage_cache_") as cache:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env={**os.environ, "RAYTUNE_KERNELS_CACHE": cache})
    except subprocess.TimeoutExpired:
        return {"model": name, "status": "failed", "error": f"timed out after {args.timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "status": "failed",
                "error": f"exit {proc.returncode}: {tail}"[:300]}
    return json.loads(lines[-1])


def summary(rows: list[dict], threads: int) -> dict:
    from raytune_kernels.cpu.machine import cpu_info

    done = [r for r in rows if r["status"] == "ok"]
    measured = [r for r in rows if r["status"] != "skipped"]
    islands: dict[str, list[str]] = {}
    for r in done:
        for op in r["islands"]:
            islands.setdefault(op, []).append(r["model"])
    return {
        "cpu": cpu_info().name, "threads": threads, "models": len(measured),
        "captured": sum(r["status"] == "ok" for r in measured),
        "compiled_and_correct": sum(bool(r.get("correct")) for r in done),
        "no_island": sum(r["island_count"] == 0 for r in done),
        "flops_in_our_kernels": round(statistics.median(
            [r["flops_in_our_kernels"] for r in done]), 4) if done else None,
        "untuned_vs_eager": _median_of(done, "untuned_vs_eager"),
        "untuned_vs_onnxruntime": _median_of(done, "untuned_vs_onnxruntime"),
        "compile_s": _median_of(done, "compile_s"),
        "islands": dict(sorted(islands.items(), key=lambda kv: -len(kv[1]))),
        "skipped": {r["model"]: r["gflops"] for r in rows if r["status"] == "skipped"},
        "failed": {r["model"]: r["error"] for r in rows if r["status"] == "failed"},
        "rows": rows,
    }


def _median_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-gflops", type=float, default=30.0)
    p.add_argument("--only", nargs="*", default=None, help="model names (zoo/name)")
    p.add_argument("--zoo", default="torchvision", choices=["torchvision", "timm", "hf", "all"])
    p.add_argument("--jobs", type=int, default=1, help="models measured at once")
    p.add_argument("--timeout", type=int, default=600, help="seconds per model")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--no-onnx", action="store_true", help="leave ONNX Runtime out")
    p.add_argument("--tune", nargs="*", default=[], metavar="MODEL",
                   help="also tune these (zoo/name) with bench/network.py and report their "
                        "time against PyTorch's best variant")
    p.add_argument("--trials", type=int, default=1000, help="per --tune model")
    p.add_argument("--tune-threads", type=int, default=2)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure_one(args.child, args.threads, args.max_gflops, args.rounds,
                                     not args.no_onnx)))
        return
    import models

    try:
        names = list(models.all_models())
    except ImportError as exc:
        print(f"coverage: {exc}", file=sys.stderr)
        sys.exit(2)
    if args.zoo != "all":
        names = [n for n in names if n.startswith(args.zoo + "/")]
    if args.only:
        names = [n for n in names if n in args.only or n.split("/", 1)[-1] in args.only]
    if not names:
        print(f"coverage: no {args.zoo} models (is it installed? {models.INSTALL_HINT})",
              file=sys.stderr)
        sys.exit(2)
    rows = []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for row in pool.map(lambda n: run_one(n, args), names):
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"command": shlex.join(["bench/coverage.py", *sys.argv[1:]]),
              **summary(rows, args.threads)}
    result["tuned"] = {m: tune_one(m, args) for m in args.tune}
    print(json.dumps(result))


def tune_one(name: str, args) -> dict:
    """bench/network.py on one model: its records (resumed), compile, and time against
    eager, channels_last, TorchScript freeze and torch.compile in one run; its figures, or
    the reason it gave none."""
    cmd = [sys.executable, os.path.join(HERE, "network.py"), name, "--trials",
           str(args.trials), "--threads", str(args.tune_threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"[:300]}
    got = json.loads(lines[-1])
    return {k: got[k] for k in ("speedup_vs_best_torch", "ours_ms", "torch_ms", "trials",
                                "threads")}


if __name__ == "__main__":
    main()
