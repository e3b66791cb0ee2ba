"""Deployment benchmark: compile once, save, load in a fresh process, and torch.compile.

    python bench/deploy.py resnet18 --threads 2 [--records FILE] [--rounds 9]
    python bench/deploy.py hf/BertModel ...      # bench/models.py's names too

From the records (default: this CPU's bench/results/<cpu>/network_MODEL_<threads>threads.jsonl),
compiles the model (compile_s), saves it (file MiB), loads it in fresh processes in which
ray, xgboost and pulp cannot be imported (load_s: the median of --loads processes, timing
raytune_kernels.compile.artifact.load alone; import_s: the imports before it), checks the
loaded network gives the same output bit for bit, then times compile_network's network and
torch.compile(model, backend="raytune_kernels") from the same records (as it comes, through
the function the entry point registers, which keeps the network it compiles; with Dynamo's
guards kept, dynamo_guards=True; and with torch's guard filter
skip_guard_on_all_nn_modules_unsafe), and, where Dynamo captured one graph, the backend's own
network called directly, interleaved round by round, and reports the median of per-round
ratios with its spread: the backend over compile_network (dynamo_over_ours), and that split
in two, the backend's network over compile_network's (the same kernels, their buffers
elsewhere) and the backend over its own network (Dynamo's cost a call). Last line of stdout:
one JSON object.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from raytune_kernels.compile.api import compile_network  # noqa: E402
from raytune_kernels.compile.dynamo import backend as dynamo_backend  # noqa: E402
from raytune_kernels.cpu.build import host_cpu  # noqa: E402
from raytune_kernels.timing import TimingOptions, median, time_fn  # noqa: E402

LEAN = "torch.compile, module guards off"  # torch.compiler.skip_guard_on_all_nn_modules_unsafe
GUARDED = "torch.compile, Dynamo's guards"  # dynamo_guards=True
OWN = "the backend's network, called directly"
CHILD = textwrap.dedent("""
    import importlib.abc, json, sys, time
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("ray", "xgboost", "pulp"):
                raise ImportError("blocked: " + name)
    sys.meta_path.insert(0, Block())
    start = time.perf_counter()
    import torch
    from raytune_kernels.compile.api import load
    imported = time.perf_counter()
    net = load(sys.argv[1])
    loaded = time.perf_counter()
    torch.set_num_threads(int(sys.argv[3]))
    x, want = torch.load(sys.argv[2])
    got = net(*x)
    pairs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
    same = all(bool(torch.equal(a, b)) for a, b in pairs)
    print(json.dumps({"import_s": imported - start, "load_s": loaded - imported,
                      "same": same}))
""")


def load_in_fresh_processes(path: str, io: str, threads: int, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        run = subprocess.run([sys.executable, "-c", CHILD, path, io, str(threads)],
                             capture_output=True, text=True, timeout=600,
                             cwd=os.path.dirname(HERE))
        if run.returncode:
            raise SystemExit(f"loading in a fresh process failed:\n{run.stderr[-3000:]}")
        out.append(json.loads(run.stdout.strip().splitlines()[-1]))
    return out


def twin(model: torch.nn.Module, tag: str) -> torch.nn.Module:
    """A shallow copy of `model` (the same submodules and weights) whose forward is a code
    object of its own: Dynamo caches its compiles by code object, so each variant compiled
    from a twin keeps its own guards, and every variant is called as a module, as a user
    calls torch.compile(model)."""
    twin = copy.copy(model)
    fwd = type(model).forward
    code = fwd.__code__.replace(co_name=f"{fwd.__name__}_{tag}")
    twin.forward = types.MethodType(types.FunctionType(
        code, fwd.__globals__, code.co_name, fwd.__defaults__, fwd.__closure__), twin)
    return twin


def interleaved(fns: dict, rounds: int) -> dict[str, list[float]]:
    """Each variant timed once a round, the order rotated each round."""
    names, times = list(fns), {n: [] for n in fns}
    opts = TimingOptions(warmup=3, min_repeat_ms=200, repeats=3)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(median(time_fn(fns[name], opts)))
    return times


def ratio(times: dict[str, list[float]], name: str) -> dict[str, float]:
    """The median and spread of a variant's per-round time over compile_network's (with
    its ~95% interval from 6 rounds on: network.spread)."""
    from network import spread

    return spread([b / a for a, b in zip(times["compile_network"], times[name])])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--records", default=None)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--loads", type=int, default=5)
    args = p.parse_args()
    from network import cpu_records, load_model, spread

    cpu = host_cpu()[0]
    records = args.records or cpu_records(cpu, args.model, args.threads)
    if not os.path.exists(records):
        print(f"no records at {records}: every task runs untuned", file=sys.stderr)
        records = None
    torch.set_num_threads(args.threads)
    model, inputs = load_model(args.model)
    start = time.perf_counter()
    net = compile_network(model, inputs, records, threads=args.threads)
    compile_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as d:
        path, io = os.path.join(d, "net.rkn"), os.path.join(d, "io.pt")
        start = time.perf_counter()
        net.save(path)
        save_s, size = time.perf_counter() - start, os.path.getsize(path)
        x = net.random_inputs(seed=1)
        torch.save((x, net(*x)), io)
        loads = load_in_fresh_processes(path, io, args.threads, args.loads)
    torch._dynamo.reset()
    options = {"records": records, "threads": args.threads}
    graphs = []

    def recording(gm, example_inputs, **kw):
        """The registered backend's function, keeping what it returns for each graph."""
        graphs.append(dynamo_backend(gm, example_inputs, options=options))
        return graphs[-1]
    dyn = torch.compile(model, backend=recording)
    guarded = torch.compile(twin(model, "guarded"), backend="raytune_kernels",
                            options={**options, "dynamo_guards": True})
    lean = torch.compile(twin(model, "lean"), backend="raytune_kernels", options={
        **options, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
    with torch.no_grad():
        for fn in (dyn, lean, guarded):
            fn(*inputs)  # Dynamo captures and we compile here, outside the timing
        fns = {"compile_network": lambda: net(*inputs),
               "torch.compile backend": lambda: dyn(*inputs),
               GUARDED: lambda: guarded(*inputs),
               LEAN: lambda: lean(*inputs)}
        if len(graphs) == 1:  # one graph: its network is the whole model
            own = getattr(graphs[0], "network", None)
            if own is not None:
                fns[OWN] = lambda: own(*inputs)
        times = interleaved(fns, args.rounds)
    for name, ts in times.items():
        print(f"{name:40s} {median(ts) * 1e3:8.3f} ms  (rounds {min(ts) * 1e3:.3f}-"
              f"{max(ts) * 1e3:.3f})")
    result = {"bench": "deploy", "model": args.model, "cpu": cpu, "threads": args.threads,
              "records": records and os.path.relpath(records, os.path.dirname(HERE)),
              "compile_s": compile_s, "save_s": save_s, "file_mib": size / 2**20,
              "load_s": median([r["load_s"] for r in loads]),
              "load_s_all": [r["load_s"] for r in loads],
              "import_s": median([r["import_s"] for r in loads]),
              "loaded_same_output": all(r["same"] for r in loads),
              "ours_ms": median(times["compile_network"]) * 1e3,
              "dynamo_ms": median(times["torch.compile backend"]) * 1e3,
              "dynamo_over_ours": ratio(times, "torch.compile backend"),
              "dynamo_guards_ms": median(times[GUARDED]) * 1e3,
              "dynamo_guards_over_ours": ratio(times, GUARDED),
              "dynamo_lean_ms": median(times[LEAN]) * 1e3,
              "dynamo_lean_over_ours": ratio(times, LEAN),
              # the backend's own network called directly: over compile_network's, what
              # two compiles of the same kernels differ by (where their buffers lie); the
              # backend over it, what the path through Dynamo costs a call
              "own_network_over_ours": ratio(times, OWN) if OWN in times else None,
              "dynamo_over_own_network": (
                  spread([b / a for a, b in zip(times[OWN], times["torch.compile backend"])])
                  if OWN in times else None),
              "rounds_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
              "torch": torch.__version__}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
