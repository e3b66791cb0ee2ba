"""What prefetching weights (the CPU kernels' knob prefetch_b) does to a compiled network:
the network compile_network builds from a model's records, against the same records'
network with prefetching taken away.

    python bench/prefetch.py resnet18 mobilenet_v2 --threads 2 [--rounds 15] [--records F]

"on" is compile_network as it comes: the plan's kernels (records with the knob either
way), and in-network refinement weighing each direct conv's or dense's kernel with the
knob turned the other way. "off" compiles the records that do not prefetch, with no such
twin weighed: the network as it was before the knob. Each round times both end to end
(CompiledNetwork.benchmark) and profiles them (each step inside the running network, and
alone with its weights cold, as records are timed), the two taking turns, the first one
alternating. Per model: medians, the median and spread of the per-round ratio off / on,
how many steps the refinement turned, and the steps whose in-network time moved most.
Records default to this CPU's bench/results/<cpu>/network_MODEL_<threads>threads.jsonl.
Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from unittest import mock

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from raytune_kernels.compile import cpu_network  # noqa: E402
from raytune_kernels.compile.api import compile_network  # noqa: E402
from raytune_kernels.cpu.build import host_cpu  # noqa: E402
from raytune_kernels.space import Config  # noqa: E402
from raytune_kernels.timing import median  # noqa: E402
from raytune_kernels.tune.records import load_records  # noqa: E402


def without_prefetch(records) -> list:
    """The records whose kernel leaves B to the hardware (no knob, or 0)."""
    return [r for r in records if not r.ok or not Config.from_json(r.config).get("prefetch_b")]


def compile_both(model, inputs, path: str, threads: int) -> dict:
    records = load_records(path).records
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # records from before the knob, named in the docs
        on = compile_network(model, inputs, records, threads=threads)
        with mock.patch.object(cpu_network, "prefetch_twin", lambda compute, cfg: None):
            off = compile_network(model, inputs, without_prefetch(records), threads=threads)
    return {"on": on, "off": off, "prefetching_records":
            len(records) - len(without_prefetch(records))}


def one_model(name: str, cpu: str, threads: int, rounds: int, records: str | None) -> dict:
    from network import cpu_records, load_model, spread

    path = records or cpu_records(cpu, name, threads)
    if not os.path.exists(path):
        raise SystemExit(f"bench/prefetch.py: no records at {path}: tune {name} first "
                         f"(bench/network.py) or name a file with --records")
    model, inputs = load_model(name)
    built = compile_both(model, inputs, path, threads)
    nets = {k: built[k] for k in ("on", "off")}
    e2e = {k: [] for k in nets}
    inside = {k: [] for k in nets}
    alone = {k: [] for k in nets}
    steps = {k: {} for k in nets}
    for r in range(rounds):
        for k in (("on", "off") if r % 2 == 0 else ("off", "on")):
            net = nets[k]
            e2e[k].append(net.benchmark())
            prof = net.profile(print_table=False, with_torch=False, end_to_end=e2e[k][-1])
            inside[k].append(prof.total_s)
            alone[k].append(prof.alone_s)
            for row in prof.rows:
                steps[k].setdefault(row.name, []).append((row.ours_s, row.alone_s))
        print(f"  round {r}: on {e2e['on'][-1] * 1e3:.3f} ms, off {e2e['off'][-1] * 1e3:.3f} ms",
              file=sys.stderr, flush=True)
    ms = lambda ts: round(median(ts) * 1e3, 3)  # noqa: E731
    moved = []
    for step in steps["on"]:
        if step not in steps["off"]:
            continue
        net_off, net_on = ([x[0] for x in steps[k][step]] for k in ("off", "on"))
        alone_off, alone_on = ([x[1] for x in steps[k][step]] for k in ("off", "on"))
        moved.append({"step": step, "network_off_us": round(median(net_off) * 1e6, 1),
                      "network_on_us": round(median(net_on) * 1e6, 1),
                      "alone_off_us": round(median(alone_off) * 1e6, 1),
                      "alone_on_us": round(median(alone_on) * 1e6, 1)})
    moved.sort(key=lambda s: s["network_on_us"] - s["network_off_us"])
    refined = nets["on"].refined
    return {"records": os.path.relpath(path, os.path.dirname(HERE)) if records is None
            else path, "prefetching_records": built["prefetching_records"],
            "turned_by_refinement": dict(refined.turned) if refined else {},
            "changed_by_refinement": len(refined.changed) if refined else 0,
            "on_ms": ms(e2e["on"]), "off_ms": ms(e2e["off"]),
            "off_over_on": spread([a / b for a, b in zip(e2e["off"], e2e["on"])]),
            "in_network_off_over_on": spread([a / b for a, b in zip(inside["off"],
                                                                     inside["on"])]),
            "alone_cold_off_over_on": spread([a / b for a, b in zip(alone["off"],
                                                                     alone["on"])]),
            "steps_moved_most": moved[:6] + moved[-3:]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--records", help="one records file (with one model)")
    args = p.parse_args()
    if args.records and len(args.models) > 1:
        raise SystemExit("bench/prefetch.py: --records names one model's records")
    cpu = host_cpu()[0]
    torch.set_num_threads(args.threads)
    out = {}
    for name in args.models:
        r = out[name] = one_model(name, cpu, args.threads, args.rounds, args.records)
        print(f"{name:16s} on {r['on_ms']:8.3f} ms  off {r['off_ms']:8.3f} ms  off/on "
              f"{r['off_over_on']['median']:.3f} ({r['off_over_on']['min']:.3f}-"
              f"{r['off_over_on']['max']:.3f})  in the network "
              f"{r['in_network_off_over_on']['median']:.3f}  alone cold "
              f"{r['alone_cold_off_over_on']['median']:.3f}  turned "
              f"{r['turned_by_refinement']}", flush=True)
    print(json.dumps({"bench": "prefetch", "cpu": cpu, "threads": args.threads,
                      "rounds": args.rounds, "models": out, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
