"""A compiled network against its steps: end to end, each step inside the running network,
and each step alone, timed as its records are (a conv's or dense's weights out of cache)
and warm.

    python bench/steps.py resnet18 mobilenet_v2 resnet50 --threads 2 [--rounds 3]

Each model is compiled from this CPU's bench/results/<cpu>/network_MODEL_<threads>threads.jsonl
(untuned where there is none), then each round times the network end to end
(CompiledNetwork.benchmark) and profiles it twice (profile(cold_weights=True), then
False). Per model: the medians over rounds, and the median and spread of the per-round
ratio of end to end over the steps' cold sum. Prints one line per model, then one JSON
object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from raytune_kernels.compile.api import compile_network  # noqa: E402
from raytune_kernels.cpu.build import host_cpu  # noqa: E402
from raytune_kernels.timing import median  # noqa: E402


def one_model(name: str, cpu: str, threads: int, rounds: int) -> dict:
    from network import cpu_records, load_model, spread

    records = cpu_records(cpu, name, threads)
    records = records if os.path.exists(records) else None
    model, inputs = load_model(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # untuned tasks, named in the JSON by records=None
        net = compile_network(model, inputs, records, threads=threads)
    e2e, inside, cold, warm = [], [], [], []
    for _ in range(rounds):
        e2e.append(net.benchmark())
        prof = net.profile(print_table=False, with_torch=False, end_to_end=e2e[-1])
        inside.append(prof.total_s)
        cold.append(prof.alone_s)
        warm.append(net.profile(print_table=False, with_torch=False, end_to_end=e2e[-1],
                                cold_weights=False).alone_s)
    ms = lambda ts: round(median(ts) * 1e3, 3)  # noqa: E731
    return {"records": records and os.path.relpath(records, os.path.dirname(HERE)),
            "end_to_end_ms": ms(e2e), "in_network_ms": ms(inside),
            "alone_cold_ms": ms(cold), "alone_warm_ms": ms(warm),
            "estimated_ms": round(net.estimated_s * 1e3, 3),
            "over_alone_cold": spread([a / b for a, b in zip(e2e, cold)]),
            "over_alone_warm": spread([a / b for a, b in zip(e2e, warm)])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    cpu = host_cpu()[0]
    torch.set_num_threads(args.threads)
    out = {}
    for name in args.models:
        r = out[name] = one_model(name, cpu, args.threads, args.rounds)
        print(f"{name:24s} end to end {r['end_to_end_ms']:8.3f} ms  in the network "
              f"{r['in_network_ms']:8.3f}  alone cold {r['alone_cold_ms']:8.3f} (x"
              f"{r['over_alone_cold']['median']:.3f})  warm {r['alone_warm_ms']:8.3f} (x"
              f"{r['over_alone_warm']['median']:.3f})  estimate {r['estimated_ms']:8.3f}"
              + ("" if r["records"] else "  (untuned)"), flush=True)
    print(json.dumps({"bench": "steps", "cpu": cpu, "threads": args.threads,
                      "rounds": args.rounds, "models": out, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
