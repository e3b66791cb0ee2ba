"""How a compiled network's layout transforms split their work between threads: the
network compile_network builds from a model's records (each parallel transform taking
bands of rows unless its producer and reader split channel blocks: compile/cpu_plan.py's
copies_by_rows) against the same plan with every transform splitting channel blocks.

    python bench/transforms.py resnet18 mobilenet_v2 --threads 2 [--rounds 15] [--records F]

"rule" is compile_network as it comes; "channels" compiles the same records with
copies_by_rows answering no everywhere. Both have the same steps; only the transforms'
loops differ. Each round clocks every step inside both running networks
(CompiledNetwork._clock_steps) and times both end to end, the two taking turns, the first
one alternating. Per model: the transforms' and all steps' in-network sums (medians of
the per-round sums), each transform's median, and channels over rule end to end (median
and spread of per-round ratios; above 1, the rule is faster). Records default to this
CPU's bench/results/<cpu>/network_MODEL_<threads>threads.jsonl. Last line of stdout: one
JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from unittest import mock

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from raytune_kernels.compile import cpu_plan, refine  # noqa: E402
from raytune_kernels.compile.api import compile_network  # noqa: E402
from raytune_kernels.cpu.build import host_cpu  # noqa: E402
from raytune_kernels.timing import median  # noqa: E402

CALLS = 15  # end-to-end calls a round, each network; its median is the round's time
RUNS = 10  # clocked runs a round, each network


def compile_both(model, inputs, path: str, threads: int) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # untuned or old records, named by compile_network
        rule = compile_network(model, inputs, path, threads=threads)
        with mock.patch.object(cpu_plan, "copies_by_rows", lambda producer, reader: False):
            channels = compile_network(model, inputs, path, threads=threads)
    if [s.name for s in rule.steps] != [s.name for s in channels.steps]:
        raise SystemExit("bench/transforms.py: the two compiles planned different steps "
                         "(the in-network refinement chose apart); run again")
    return {"rule": rule, "channels": channels}


def one_model(name: str, cpu: str, threads: int, rounds: int, records: str | None) -> dict:
    from network import cpu_records, load_model, spread

    path = records or cpu_records(cpu, name, threads)
    if not os.path.exists(path):
        raise SystemExit(f"bench/transforms.py: no records at {path}: tune {name} first "
                         f"(bench/network.py) or name a file with --records")
    model, inputs = load_model(name)
    nets = compile_both(model, inputs, path, threads)
    xs = nets["rule"].random_inputs()
    laps = {k: [] for k in nets}
    e2e = {k: [] for k in nets}
    for r in range(rounds):
        for k in (("rule", "channels") if r % 2 == 0 else ("channels", "rule")):
            laps[k].append(nets[k]._clock_steps(xs, RUNS))
            e2e[k].append(refine._median_call(nets[k], xs, CALLS))
        print(f"  round {r}: rule {e2e['rule'][-1] * 1e3:.3f} ms, channels "
              f"{e2e['channels'][-1] * 1e3:.3f} ms", file=sys.stderr, flush=True)
    steps = nets["rule"].steps
    moved = [i for i, s in enumerate(steps) if s.kind == "transform"]
    per = {k: np.asarray(v) for k, v in laps.items()}
    us = lambda a: round(float(np.median(a)) * 1e6, 1)  # noqa: E731
    return {"records": os.path.relpath(path, os.path.dirname(HERE)) if records is None
            else path,
            "transforms": len(moved),
            "transforms_rule_us": us(per["rule"][:, moved].sum(1)),
            "transforms_channels_us": us(per["channels"][:, moved].sum(1)),
            "steps_rule_us": us(per["rule"].sum(1)),
            "steps_channels_us": us(per["channels"].sum(1)),
            "rule_ms": round(median(e2e["rule"]) * 1e3, 3),
            "channels_ms": round(median(e2e["channels"]) * 1e3, 3),
            "channels_over_rule": spread([c / r for c, r in zip(e2e["channels"],
                                                                e2e["rule"])]),
            "each_transform": [{"step": steps[i].name, "rule_us": us(per["rule"][:, i]),
                                "channels_us": us(per["channels"][:, i])} for i in moved]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--records", help="one records file (with one model)")
    args = p.parse_args()
    if args.records and len(args.models) > 1:
        raise SystemExit("bench/transforms.py: --records names one model's records")
    if args.threads < 2:
        raise SystemExit("bench/transforms.py: at 1 thread no transform runs in parallel")
    cpu = host_cpu()[0]
    torch.set_num_threads(args.threads)
    out = {}
    for name in args.models:
        r = out[name] = one_model(name, cpu, args.threads, args.rounds, args.records)
        ratio = r["channels_over_rule"]
        print(f"{name:16s} transforms {r['transforms_channels_us']:8.1f} -> "
              f"{r['transforms_rule_us']:8.1f} us  steps {r['steps_channels_us']:9.1f} -> "
              f"{r['steps_rule_us']:9.1f} us  end to end channels/rule {ratio['median']:.3f} "
              f"({ratio['min']:.3f}-{ratio['max']:.3f})", flush=True)
    print(json.dumps({"bench": "transforms", "cpu": cpu, "threads": args.threads,
                      "rounds": args.rounds, "models": out, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
