"""Network benchmark: tune (or reuse records), compile, and time against PyTorch in one run.

    python bench/network.py resnet18 --trials 1000 --threads 2 [--records FILE]

Tunes the model's tasks with `trials` measurements at `threads` threads (a records file that
already holds them is resumed, nothing re-measured), compiles it twice (layouts chosen by
the ILP, and the best uniform layout), checks both against the model, then times, at the
same thread count and interleaved round by round: ours, ours uniform, PyTorch eager,
channels_last, TorchScript trace+freeze, and torch.compile with freezing where the machine
can build it. Prints the per-layer profile and the fidelity report.
Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

from raytune_kernels import tune_network, zoo
from raytune_kernels.network import compile_network
from raytune_kernels.timing import TimingOptions, median, time_fn

FULL = TimingOptions(warmup=3, min_repeat_ms=200, repeats=5)


def torch_variants(model, x, use_compile: bool) -> dict:
    """name -> zero-argument callable, or None where the variant cannot be built here."""
    out = {"eager": lambda: model(x)}
    cl_model = copy.deepcopy(model).to(memory_format=torch.channels_last)
    cl_x = x.contiguous(memory_format=torch.channels_last)
    out["channels_last"] = lambda: cl_model(cl_x)
    with torch.no_grad():
        frozen = torch.jit.freeze(torch.jit.trace(copy.deepcopy(model), (x,)).eval())
        for _ in range(3):
            frozen(x)  # TorchScript optimises on the first calls
    out["jit_freeze"] = lambda: frozen(x)
    out["compile"] = None
    if use_compile:
        try:
            import torch._inductor.config as inductor

            inductor.freezing = True
            compiled = torch.compile(copy.deepcopy(model))
            with torch.no_grad():
                compiled(x)
            out["compile"] = lambda: compiled(x)
        except Exception as exc:  # no compiler toolchain, unsupported op: report, go on
            print(f"torch.compile unavailable here: {type(exc).__name__}: {exc}"[:300],
                  file=sys.stderr)
    return out


def interleaved(fns: dict, rounds: int) -> dict:
    times: dict[str, list[float]] = {k: [] for k, f in fns.items() if f is not None}
    with torch.no_grad():
        for _ in range(rounds):
            for k in times:
                times[k].append(median(time_fn(fns[k], FULL)))
    return {k: median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--records", default=None, help="default bench/results/network_MODEL_"
                                                    "<threads>threads.jsonl")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--png", default=None, help="save the per-layer chart here")
    args = ap.parse_args()
    records = args.records or os.path.join(
        os.path.dirname(__file__), "results", f"network_{args.model}_{args.threads}threads.jsonl")
    model, inputs = zoo.load(args.model)
    x = inputs[0]

    start = time.perf_counter()
    tuned = tune_network(model, inputs, trials=args.trials, records=records,
                         threads=args.threads, verbose=False)
    tune_s = time.perf_counter() - start
    import ray
    ray.shutdown()  # nothing of Ray's running while we time
    torch.set_num_threads(args.threads)
    print(f"tuned {tuned.trials} trials ({tune_s:.0f} s this run), estimated "
          f"{tuned.estimated_latency_s * 1e3:.3f} ms")

    start = time.perf_counter()
    net = compile_network(model, inputs, records, threads=args.threads, verbose=True)
    uniform = compile_network(model, inputs, records, threads=args.threads, layout="uniform",
                              verbose=True)
    print(f"compiled and checked both in {time.perf_counter() - start:.0f} s")

    fns = {"ours": lambda: net(x), "uniform": lambda: uniform(x)}
    fns.update(torch_variants(model, x, not args.no_compile))
    ms = {k: v * 1e3 for k, v in interleaved(fns, args.rounds).items()}
    prof = net.profile(png=args.png)
    print(net.fidelity(ms["ours"] / 1e3, prof))
    torch_ms = {k: (round(ms[k], 3) if k in ms else None)
                for k in ("eager", "channels_last", "jit_freeze", "compile")}
    best_torch = min(v for v in torch_ms.values() if v is not None)
    result = {"model": args.model, "threads": args.threads, "trials": tuned.trials,
              "ours_ms": round(ms["ours"], 3), "uniform_ms": round(ms["uniform"], 3),
              "estimated_ms": round(net.estimated_s * 1e3, 3),
              "layout_plan_ms": round(net.plan.cost * 1e3, 3),
              "torch_ms": torch_ms, "speedup_vs_best_torch": round(best_torch / ms["ours"], 3)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
