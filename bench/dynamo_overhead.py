"""What torch.compile adds per call around the raytune_kernels backend's network.

    python bench/dynamo_overhead.py resnet18 --threads 2 [--records FILE] [--calls 300]

Each variant runs in a fresh process (Dynamo keeps its compiled entries per code object, so
variants in one process could run each other's), compiles the model through the backend
from the records (default: this CPU's bench/results/<cpu>/network_MODEL_<threads>threads.jsonl)
and times `--calls` calls one by one, each split in three by clocks around the callable the
backend returned: before it starts (Dynamo's guards and the fetching of the graph's
inputs), inside it (our network), and after it returns. Variants:

  backend        as it comes (Dynamo's guards on the weights dropped: lean guards)
  dynamo_guards  with every Dynamo guard kept (dynamo_guards=True)
  free_tensors   torch._dynamo.config.install_free_tensors: the weights are no inputs
  skip_modules   torch's guard filter skip_guard_on_all_nn_modules_unsafe
  free_and_skip  both
  skip_guards    as the backend, called under torch.compiler.set_stance(
                 skip_guard_eval_unsafe=True): Dynamo evaluates no guard while a frame has
                 one compiled entry (unsafe: a changed module still runs the old graph)
  no_network     as the backend, but the callable returns a saved output and runs nothing:
                 Dynamo's work with the caches as it left them

Prints one line per variant (medians over the calls), then one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

VARIANTS = ("backend", "dynamo_guards", "free_tensors", "skip_modules", "free_and_skip",
            "skip_guards", "no_network")


def child(args) -> dict:
    """One variant in this process: medians of before / inside / after, in microseconds."""
    import torch
    import torch._dynamo.config as dynamo_config

    from network import load_model
    from raytune_kernels.compile.dynamo import backend
    from raytune_kernels.timing import median

    torch.set_num_threads(args.threads)
    model, inputs = load_model(args.model)
    v = args.variant
    marks, graphs = [], []
    options = {"records": args.records, "threads": args.threads,
               "dynamo_guards": v == "dynamo_guards"}

    def traced(gm, example_inputs):
        run = backend(gm, example_inputs, options=options)
        graphs.append(len(example_inputs))
        saved = []

        def timed(*a):
            start = time.perf_counter()
            if v == "no_network" and saved:
                out = saved[0]
            else:
                out = run(*a)
                saved[:] = [out]
            marks.append((start, time.perf_counter()))
            return out
        return timed

    skip = v in ("skip_modules", "free_and_skip")
    compiled = torch.compile(model, backend=traced, options={
        "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe} if skip else None)
    before, inside, after = [], [], []
    with torch.no_grad():
        with dynamo_config.patch(install_free_tensors=v in ("free_tensors", "free_and_skip")):
            compiled(*inputs)  # traced and compiled here
        if v == "skip_guards":
            torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
        for _ in range(3):
            compiled(*inputs)
        for _ in range(args.calls):
            marks.clear()
            start = time.perf_counter()
            compiled(*inputs)
            end = time.perf_counter()
            if len(marks) != 1:
                raise SystemExit(f"{v}: {len(marks)} graphs ran in one call (a graph break?)")
            (a, b), = marks
            before.append(a - start)
            inside.append(b - a)
            after.append(end - b)
    return {"graph_inputs": graphs[0], "before_us": median(before) * 1e6,
            "inside_us": median(inside) * 1e6, "after_us": median(after) * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--records", default=None)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # a child's
    args = p.parse_args()
    if args.variant:
        print(json.dumps(child(args)))
        return
    from network import cpu_records
    from raytune_kernels.cpu.build import host_cpu

    cpu = host_cpu()[0]
    records = args.records or cpu_records(cpu, args.model, args.threads)
    if not os.path.exists(records):
        sys.exit(f"no records at {records}: pass --records")
    out = {}
    for v in VARIANTS:
        proc = subprocess.run([sys.executable, __file__, args.model, "--threads",
                               str(args.threads), "--records", records, "--calls",
                               str(args.calls), "--variant", v],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"variant {v} failed:\n{proc.stderr[-2000:]}")
        out[v] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = out[v]
        print(f"{v:14s} {r['graph_inputs']:4d} inputs  before {r['before_us']:7.1f} us  "
              f"inside {r['inside_us'] / 1e3:7.3f} ms  after {r['after_us']:6.1f} us",
              flush=True)
    import torch

    print(json.dumps({"bench": "dynamo_overhead", "model": args.model, "cpu": cpu,
                      "threads": args.threads, "calls": args.calls,
                      "records": os.path.relpath(records, os.path.dirname(HERE)),
                      "variants": out, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
