"""What a call of a compiled CPU network costs outside its native run: the input handed to
the kernels where it lies (CompiledNetwork.__call__ as it comes) against the same network
copying its input into its own buffer first, as it did before.

    python bench/boundary.py resnet18 mobilenet_v2 --threads 2 [--rounds 201] [--records F]

One network per model, one call each way a round (the first alternating). Each call is timed whole and its native run alone (a clock
around CompiledNetwork._run), so "outside" is what the call spends on checks, copies and
PyTorch around the run. Per model: medians, and the median and spread of the per-round
ratio copied / handed end to end. Records default to this CPU's
bench/results/<cpu>/network_MODEL_<threads>threads.jsonl; `--records none` compiles
untuned. Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from raytune_kernels.compile.api import compile_network  # noqa: E402
from raytune_kernels.cpu.build import host_cpu  # noqa: E402
from raytune_kernels.timing import median  # noqa: E402

WAYS = ("handed", "copied")


def one_model(name: str, cpu: str, threads: int, rounds: int, records: str | None) -> dict:
    from network import cpu_records, load_model, spread

    path = records or cpu_records(cpu, name, threads)
    if path != "none" and not os.path.exists(path):
        raise SystemExit(f"bench/boundary.py: no records at {path}: tune {name} first "
                         f"(bench/network.py), name a file with --records, or --records none")
    model, inputs = load_model(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = compile_network(model, inputs, None if path == "none" else path,
                              threads=threads)
    slots = net._in_slots
    handed = sum(s is not None for s in slots)
    if not handed:
        raise SystemExit(f"bench/boundary.py: {name}'s network copies every input in "
                         f"(a PyTorch step or a bordered buffer reads it): nothing to compare")
    run, inside = net._run, [0.0]

    def clocked_run() -> None:
        t = time.perf_counter()
        run()
        inside[0] = time.perf_counter() - t
    net._run = clocked_run
    xs = net.random_inputs()
    whole = {k: [] for k in WAYS}
    outside = {k: [] for k in WAYS}
    ratios = []  # per round: copied over handed, end to end
    with torch.no_grad():
        for r in range(rounds):
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                net._in_slots = slots if way == "handed" else [None] * len(slots)
                t = time.perf_counter()
                net(*xs)
                took = time.perf_counter() - t
                whole[way].append(took)
                outside[way].append(took - inside[0])
            ratios.append(whole["copied"][-1] / whole["handed"][-1])
    net._in_slots, net._run = slots, run
    return {"records": path if records else os.path.relpath(path, os.path.dirname(HERE)),
            "inputs_handed": handed, "inputs": len(slots),
            "input_bytes": sum(x.numel() * x.element_size() for x in xs),
            **{f"{k}_ms": round(median(whole[k]) * 1e3, 3) for k in WAYS},
            **{f"{k}_outside_us": round(median(outside[k]) * 1e6, 1) for k in WAYS},
            "copied_over_handed": spread(ratios)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=201)
    p.add_argument("--records", help="one records file (with one model), or none")
    args = p.parse_args()
    if args.records and args.records != "none" and len(args.models) > 1:
        raise SystemExit("bench/boundary.py: --records names one model's records")
    cpu = host_cpu()[0]
    torch.set_num_threads(args.threads)
    out = {}
    for name in args.models:
        r = out[name] = one_model(name, cpu, args.threads, args.rounds, args.records)
        c = r["copied_over_handed"]
        print(f"{name:16s} handed {r['handed_ms']:8.3f} ms (outside the run "
              f"{r['handed_outside_us']:.0f} us)  copied {r['copied_ms']:8.3f} ms (outside "
              f"{r['copied_outside_us']:.0f} us)  copied/handed {c['median']:.3f} "
              f"({c['min']:.3f}-{c['max']:.3f})", flush=True)
    print(json.dumps({"bench": "boundary", "cpu": cpu, "threads": args.threads,
                      "rounds": args.rounds, "models": out,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
