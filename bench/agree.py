"""What the split agreement's second pass does to a compiled network: compile_network as it
comes (after the records that split rows, the plan's own kernels with their loops reordered
to split rows first, schedules.rows_first_twin, are weighed where no record splits rows)
against the same records compiled with that second pass offered nothing.

    python bench/agree.py resnet18 mobilenet_v2 resnet50 --threads 2 [--rounds 41]
                          [--records F]

Both networks of a model are called in turns (the first alternating each round), `CALLS`
calls each a round, the round's time their median; per model: medians, the median and
spread of the per-round ratio records / reordered (above 1, the reordered kernels run
faster), and what each agreement kept. Records default to this CPU's
bench/results/<cpu>/network_MODEL_<threads>threads.jsonl. Last line of stdout: one JSON
object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from unittest import mock

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from raytune_kernels.compile import cpu_network  # noqa: E402
from raytune_kernels.compile.api import compile_network  # noqa: E402
from raytune_kernels.cpu.build import host_cpu  # noqa: E402
from raytune_kernels.timing import median  # noqa: E402

CALLS = 5
SIDES = ("reordered", "records")


def agreed_fields(report) -> dict:
    return {"by_records": report.steps, "kept": report.kept, "reordered": report.reordered,
            "reordered_kept": report.reordered_kept,
            "end_to_end": None if report.speedup is None else round(report.speedup, 3),
            "seconds": round(report.seconds, 1), "recalled": report.recalled}


def one_model(name: str, cpu: str, threads: int, rounds: int, records: str | None) -> dict:
    from network import cpu_records, load_model, spread

    path = records or cpu_records(cpu, name, threads)
    if not os.path.exists(path):
        raise SystemExit(f"bench/agree.py: no records at {path}: tune {name} first "
                         f"(bench/network.py) or name a file with --records")
    model, inputs = load_model(name)
    nets = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # untuned or old records, named by compile_network
        nets["reordered"] = compile_network(model, inputs, path, threads=threads)
        with mock.patch.object(cpu_network, "rows_first_twin", lambda *a, **k: None):
            nets["records"] = compile_network(model, inputs, path, threads=threads)
    xs = nets["reordered"].random_inputs()
    times = {k: [] for k in SIDES}
    ratios = []
    with torch.no_grad():
        for r in range(rounds):
            for k in (SIDES if r % 2 == 0 else SIDES[::-1]):
                took = []
                for _ in range(CALLS):
                    t = time.perf_counter()
                    nets[k](*xs)
                    took.append(time.perf_counter() - t)
                times[k].append(median(took))
            ratios.append(times["records"][-1] / times["reordered"][-1])
            print(f"  round {r}: reordered {times['reordered'][-1] * 1e3:.3f} ms, records "
                  f"{times['records'][-1] * 1e3:.3f} ms", file=sys.stderr, flush=True)
    return {"records": os.path.relpath(path, os.path.dirname(HERE)) if records is None
            else path,
            **{f"{k}_ms": round(median(times[k]) * 1e3, 3) for k in SIDES},
            "records_over_reordered": spread(ratios),
            **{f"agreed_{k}": agreed_fields(nets[k].agreed) for k in SIDES}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--records", help="one records file (with one model)")
    args = p.parse_args()
    if args.records and len(args.models) > 1:
        raise SystemExit("bench/agree.py: --records names one model's records")
    if args.threads < 2:
        raise SystemExit("bench/agree.py: one thread splits nothing: give --threads 2 or more")
    cpu = host_cpu()[0]
    torch.set_num_threads(args.threads)
    out = {}
    for name in args.models:
        r = out[name] = one_model(name, cpu, args.threads, args.rounds, args.records)
        s, a = r["records_over_reordered"], r["agreed_reordered"]
        print(f"{name:16s} reordered {r['reordered_ms']:8.3f} ms  records {r['records_ms']:8.3f} ms"
              f"  records/reordered {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})  kept "
              f"{a['kept']} by records, {a['reordered_kept']} of {a['reordered']} reordered",
              flush=True)
    print(json.dumps({"bench": "agree", "cpu": cpu, "threads": args.threads,
                      "rounds": args.rounds, "calls": CALLS, "models": out,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
