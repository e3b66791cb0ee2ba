"""A compiled network's layout transforms, two ways, timed inside both running networks.

    python bench/transforms.py resnet18 mobilenet_v2 --threads 2 [--rounds 15] [--records F]
                               [--compare rows|nhwc|twins|timed]

--compare rows (the default): how the transforms split their work between threads. "rule"
is compile_network as it comes (each parallel transform taking bands of rows unless its
producer and reader split channel blocks: compile/cpu_plan.py's copies_by_rows);
"channels" compiles the same records with copies_by_rows answering no everywhere. Both
have the same steps; only the transforms' loops differ.

--compare twins: the layout plan offered each conv's records that read channel blocks as
reading NHWC values as they lie (compile/cpu_network.nhwc_twins; "twins", compile_network
as it comes) or only the records (configs whose block spans every channel read NHWC):
both compiled and refined in full, the ILP's and the weighings' choices their own.

--compare timed: the twins timed before the layout plan takes them (compile/cpu_network.
_timed_twins: each twin the plan chose timed beside its original, priced by their ratio,
and the plan solved again; "timed", compile_network as it comes) or priced as their
originals' records ("priced": one plan, as before the twins were timed). Both refined in
full; the JSON gives each timed twin's ratio to its original.

--compare nhwc: the copies that bring an NHWC value into a conv's channel blocks.
"nhwc" compiles the records with compile/cpu_plan.nhwc_reads's plan kept whatever its
weighing said (convs read NHWC values as they are, and convs none of whose readers take
their blocks as they are write NHWC); "copies" without it (the transforms stay). Both
skip refine's and the split agreement's picks (each would weigh its own plan's kernels
apart), so that the two networks differ by the copies and the turned kernels alone.

Each round clocks every step inside both running networks (CompiledNetwork._clock_steps)
and times both end to end, the two taking turns, the first one alternating. Per model:
the transforms' and all steps' in-network sums (medians of the per-round sums), each
transform's median, and the second over the first end to end (median and spread of
per-round ratios; above 1, the first is faster). Records default to this CPU's
bench/results/<cpu>/network_MODEL_<threads>threads.jsonl. Last line of stdout: one JSON
object.
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


SIDES = {"rows": ("rule", "channels"), "nhwc": ("nhwc", "copies"),
         "twins": ("twins", "records"), "timed": ("timed", "priced")}


def priced_twins(part, cands, twinned, plan_of, *args):
    """compile/cpu_network._timed_twins as it stood before it timed: one plan over the
    twins, each priced as its original's record."""
    plan, chosen = plan_of(twinned)
    return plan, chosen, {}


def compile_both(model, inputs, path: str, threads: int, compare: str = "rows") -> dict:
    from raytune_kernels.compile import cpu_network

    first, second = SIDES[compare]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # untuned or old records, named by compile_network
        if compare == "rows":
            nets = {first: compile_network(model, inputs, path, threads=threads)}
            with mock.patch.object(cpu_plan, "copies_by_rows", lambda producer, reader: False):
                nets[second] = compile_network(model, inputs, path, threads=threads)
        elif compare == "timed":
            nets = {first: compile_network(model, inputs, path, threads=threads)}
            with mock.patch.object(cpu_network, "_timed_twins", priced_twins):
                nets[second] = compile_network(model, inputs, path, threads=threads)
        elif compare == "twins":
            nets = {first: compile_network(model, inputs, path, threads=threads)}
            with mock.patch.object(cpu_network, "nhwc_twins", lambda task, cands: []):
                nets[second] = compile_network(model, inputs, path, threads=threads)
        else:
            def kept(part, chosen, *args):  # args: ..., threads, the plan with nhwc_twins
                twins = args[4] if len(args) > 4 else None
                fused = cpu_plan.nhwc_reads(part, chosen if twins is None else twins)
                return fused, refine.NhwcReads(steps=len(refine.differences(chosen, fused)),
                                               kept=True)
            unrefined = (mock.patch.object(cpu_network, "_refine",
                                           lambda part, chosen, *args: (chosen, None, None)),
                         mock.patch.object(cpu_network, "_agree",
                                           lambda part, chosen, *args: (chosen, None, args[-1])))
            with unrefined[0], unrefined[1]:
                with mock.patch.object(cpu_network, "_nhwc_reads", kept):
                    nets = {first: compile_network(model, inputs, path, threads=threads)}
                with mock.patch.object(cpu_network, "_nhwc_reads",
                                       lambda part, chosen, *args: (chosen, refine.NhwcReads())):
                    nets[second] = compile_network(model, inputs, path, threads=threads)
            if not nets[first].nhwc_reads.steps:
                raise SystemExit("bench/transforms.py: no conv of this plan reads an NHWC "
                                 "value through a copy: nothing to compare")
    if compare == "rows" and [s.name for s in nets[first].steps] != \
            [s.name for s in nets[second].steps]:
        raise SystemExit("bench/transforms.py: the two compiles planned different steps "
                         "(the in-network refinement chose apart); run again")
    return nets


def one_model(name: str, cpu: str, threads: int, rounds: int, records: str | None,
              compare: str = "rows") -> dict:
    from network import cpu_records, load_model, spread

    path = records or cpu_records(cpu, name, threads)
    if not os.path.exists(path):
        raise SystemExit(f"bench/transforms.py: no records at {path}: tune {name} first "
                         f"(bench/network.py) or name a file with --records")
    model, inputs = load_model(name)
    a, b = SIDES[compare]
    nets = compile_both(model, inputs, path, threads, compare)
    xs = nets[a].random_inputs()
    laps = {k: [] for k in nets}
    e2e = {k: [] for k in nets}
    for r in range(rounds):
        for k in ((a, b) if r % 2 == 0 else (b, a)):
            laps[k].append(nets[k]._clock_steps(xs, RUNS))
            e2e[k].append(refine._median_call(nets[k], xs, CALLS))
        print(f"  round {r}: {a} {e2e[a][-1] * 1e3:.3f} ms, {b} {e2e[b][-1] * 1e3:.3f} ms",
              file=sys.stderr, flush=True)
    per = {k: np.asarray(v) for k, v in laps.items()}
    moved = {k: [i for i, s in enumerate(nets[k].steps) if s.kind == "transform"]
             for k in nets}
    us = lambda x: round(float(np.median(x)) * 1e6, 1)  # noqa: E731
    out = {"records": os.path.relpath(path, os.path.dirname(HERE)) if records is None
           else path}
    for k in (a, b):
        out[f"transforms_{k}"] = len(moved[k])
        out[f"transforms_{k}_us"] = us(per[k][:, moved[k]].sum(1))
        out[f"steps_{k}_us"] = us(per[k].sum(1))
        out[f"{k}_ms"] = round(median(e2e[k]) * 1e3, 3)
    out[f"{b}_over_{a}"] = spread([y / x for x, y in zip(e2e[a], e2e[b])])
    if compare == "rows":  # the same steps: each transform both ways
        out["each_transform"] = [{"step": nets[a].steps[i].name, f"{a}_us": us(per[a][:, i]),
                                  f"{b}_us": us(per[b][:, i])} for i in moved[a]]
    else:
        out["each_transform"] = {k: [{"step": nets[k].steps[i].name, "us": us(per[k][:, i])}
                                     for i in moved[k]] for k in (a, b)}
        out["nhwc_steps"] = nets[a].nhwc_reads.steps
        if compare in ("twins", "timed"):
            out["nhwc_kept"] = {k: nets[k].nhwc_reads.kept for k in (a, b)}
        if compare == "timed":  # each twin's time over its original's, as the compile timed
            out["twins_timed"] = sorted(round(r, 3) for r in nets[a].twins_timed.values())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--records", help="one records file (with one model)")
    p.add_argument("--compare", choices=sorted(SIDES), default="rows")
    args = p.parse_args()
    if args.records and len(args.models) > 1:
        raise SystemExit("bench/transforms.py: --records names one model's records")
    if args.threads < 2 and args.compare == "rows":
        raise SystemExit("bench/transforms.py: at 1 thread no transform runs in parallel")
    cpu = host_cpu()[0]
    torch.set_num_threads(args.threads)
    a, b = SIDES[args.compare]
    out = {}
    for name in args.models:
        r = out[name] = one_model(name, cpu, args.threads, args.rounds, args.records,
                                  args.compare)
        ratio = r[f"{b}_over_{a}"]
        print(f"{name:16s} transforms {r[f'transforms_{b}_us']:8.1f} -> "
              f"{r[f'transforms_{a}_us']:8.1f} us  steps {r[f'steps_{b}_us']:9.1f} -> "
              f"{r[f'steps_{a}_us']:9.1f} us  end to end {b}/{a} {ratio['median']:.3f} "
              f"({ratio['min']:.3f}-{ratio['max']:.3f})", flush=True)
    print(json.dumps({"bench": "transforms", "compare": args.compare, "cpu": cpu,
                      "threads": args.threads, "rounds": args.rounds, "models": out,
                      # each side's refine and split agreement: nhwc skips both
                      "refined": args.compare != "nhwc", "torch": torch.__version__}))


if __name__ == "__main__":
    main()
