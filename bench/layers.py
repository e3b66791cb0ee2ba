"""Where a compiled network gains or loses against the engines, layer by layer.

    python bench/layers.py resnet18 mobilenet_v2 --threads 2 [--rounds 7] [--records F]
                           [--precision bf16]

Per model: compile_network from the records (default: this CPU's
bench/results/<cpu>/network_MODEL_<threads>threads.jsonl; `--records none`: untuned) and
the model exported to ONNX once, as bench/network.py exports it. Each round, the three in
turn (the first one rotating): our steps clocked inside the running network
(CompiledNetwork._clock_steps), ONNX Runtime's nodes under its profiler and OpenVINO's
under PERF_COUNT (--engines picks), each over RUNS runs (medians). --precision bf16
compiles for `llvm -precision=bf16` (records default to ..._bf16.jsonl) and runs OpenVINO
in bf16, as it runs by default on a CPU with bf16 arithmetic; ONNX Runtime stays f32.

The engines' node names keep the scopes of the modules they came from
(/model/layer1/layer1.0/conv1/...), and their nodes run in an order of the graph, as ours
do. Each node is attached to one of our steps (attach): to the step whose layer its scopes
name; a conv, matmul or pool whose fused name is another's (a conv fused with its
activation is named after the activation) to the next kernel step none has claimed; any
other node (a separate activation or add, a layout reorder) to the step of the node that
ran before it. Nodes before any step count as unattributed. Our transforms have no layer:
their time stands alone.

Per step: each side's median over rounds and the median of the per-round ratios engine /
ours (above 1, ours is faster), the steps ordered by what they would save if they ran as
fast as the faster engine. Profilers add a little to every node, engines' and ours alike;
end-to-end figures belong to bench/network.py. Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from raytune_kernels.compile.api import compile_network  # noqa: E402
from raytune_kernels.cpu.build import host_cpu  # noqa: E402
from raytune_kernels.precision import DEFAULT  # noqa: E402
from raytune_kernels.timing import median  # noqa: E402

RUNS = 20  # runs a round, each side; the median of each node's or step's times
ENGINES = ("onnxruntime", "openvino")
ROOT = "model"  # the exporting wrapper's attribute (network._Flat): every scope's first


def module_of(name: str, modules: set[str]) -> str | None:
    """The module an engine node's name comes from: its scopes
    (/model/layer2/layer2.0/downsample/downsample.0/Conv/...) walked while each names a
    module, a scope being a path from the last module or from any module above it (the
    ONNX exporter names a child of a Sequential from its Sequential's parent: conv.0.0
    under features.1.conv); None where the first scope names none."""
    parts = [p for p in name.split("/") if p]
    if parts and parts[0] == ROOT:
        parts = parts[1:]
    path = None
    for part in parts:
        bases = [path] if path else []
        while bases and "." in bases[-1]:
            bases.append(bases[-1].rsplit(".", 1)[0])
        found = next((c for c in [f"{b}.{part}" for b in bases] + [part] if c in modules), None)
        if found is None:
            break
        path = found
    return path


COMPUTE = ("Conv", "Gemm", "MatMul", "FullyConnected", "Pool", "ReduceMean")


def attach(nodes: list[tuple[str, str, float]], steps: list[tuple[str, ...]],
           kernels: list[bool]) -> tuple[list[float], float, list[str]]:
    """Engine seconds per step, the seconds unattributed and the names of those nodes.
    `nodes`: (name, op, seconds) in the engine's order of execution; `steps`: each step's
    layers; `kernels`: which steps are our kernels. A node of a step's layer goes to that
    step. Other compute nodes (a conv fused with its activation and named after it) go to
    the first kernel step no node has claimed after the previous node's; the rest (an
    activation, a residual add, a reorder) go with the node before them."""
    owner = {layer: k for k, layers in enumerate(steps) for layer in layers}
    modules = set(owner)
    for layer in owner:
        parts = layer.split(".")
        modules.update(".".join(parts[:n]) for n in range(1, len(parts)))
    named = [owner.get(module_of(name, modules)) for name, _, _ in nodes]
    claimed = {k for k in named if k is not None}
    per, lost, names = [0.0] * len(steps), 0.0, []
    prev = None
    for (name, op, seconds), k in zip(nodes, named):
        if k is None and any(c in op for c in COMPUTE):
            after = -1 if prev is None else prev
            k = next((j for j in range(after + 1, len(steps))
                      if kernels[j] and j not in claimed), None)
            if k is not None:
                claimed.add(k)
        if k is None:
            k = prev
        if k is None:
            lost += seconds
            names.append(name)
        else:
            per[k] += seconds
            prev = k
    return per, lost, names


class OrtProfile:
    """ONNX Runtime (every graph optimisation, `threads` intra-op threads) with its
    profiler on. Its profile is read once, at the end (the profiler cannot be restarted):
    each round's runs are told apart by the profiler's own run events."""

    WARMUP = 5  # runs before the first round, left out

    def __init__(self, path: str, feeds: dict, threads: int, workdir: str):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(workdir, "ort")
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.feeds, self.version, self.runs = feeds, ort.__version__, []
        for _ in range(self.WARMUP):
            self.session.run(None, self.feeds)

    def round(self, runs: int) -> None:
        self.runs.append(runs)
        for _ in range(runs):
            self.session.run(None, self.feeds)

    def rounds(self) -> list[list[tuple[str, str, float]]]:
        """Each round's nodes in the order they ran: (name, op, median kernel seconds over
        its runs)."""
        with open(self.session.end_profiling()) as f:
            events = json.load(f)
        runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                      if e.get("name") == "model_run")[self.WARMUP:]
        if len(runs) != sum(self.runs):
            raise RuntimeError(f"ONNX Runtime's profile holds {len(runs)} timed runs, "
                               f"not {sum(self.runs)}")
        starts = np.array([a for a, _ in runs])
        ends = np.cumsum(self.runs)  # the first run of round r + 1
        out: list[dict[tuple[str, str], list[float]]] = [{} for _ in self.runs]
        for e in events:
            if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
                continue
            run = int(np.searchsorted(starts, e["ts"], side="right")) - 1
            if run < 0:
                continue  # a warm-up run
            r = int(np.searchsorted(ends, run, side="right"))
            out[r].setdefault((e["name"][: -len("_kernel_time")],
                               e.get("args", {}).get("op_name", "")), []).append(e["dur"] / 1e6)
        return [[(n, op, median(v)) for (n, op), v in times.items()] for times in out]


class OvProfile:
    """OpenVINO (CPU, LATENCY hint, `precision` f32 or bf16, `threads` threads) with
    PERF_COUNT: each executed node's median time over a round's runs."""

    def __init__(self, path: str, feeds: list, threads: int, precision: str = "f32"):
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": precision, "PERF_COUNT": "YES"})
        self.request, self.feeds, self.version = compiled.create_infer_request(), feeds, \
            ov.__version__
        for _ in range(OrtProfile.WARMUP):
            self.request.infer(self.feeds)

    def round(self, runs: int) -> list[tuple[str, str, float]]:
        """The nodes in the order they ran: (name, type, median seconds over `runs`)."""
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(runs):
            self.request.infer(self.feeds)
            for p in self.request.profiling_info:
                if p.status == p.Status.EXECUTED:
                    times.setdefault((p.node_name, p.node_type), []).append(
                        p.real_time.total_seconds())
        return [(n, op, median(v)) for (n, op), v in times.items()]


def engines(model, inputs, threads: int, workdir: str, wanted=ENGINES,
            precision: str = DEFAULT) -> tuple[dict, dict]:
    """The profiled engines that build here, and why the others do not."""
    from network import export_onnx

    path = os.path.join(workdir, "model.onnx")
    feeds = [x.numpy() for x in inputs]
    try:
        names = export_onnx(model, inputs, path)
    except Exception as exc:
        why = f"ONNX export failed: {type(exc).__name__}: {exc}"[:300]
        print(f"no engine here: {why}", file=sys.stderr)
        return {}, {name: why for name in wanted}
    made, missing = {}, {}
    for name, make in (("onnxruntime", lambda: OrtProfile(path, dict(zip(names, feeds)),
                                                          threads, workdir)),
                       ("openvino", lambda: OvProfile(
                           path, feeds, threads, "bf16" if precision == "bf16" else "f32"))):
        if name not in wanted:
            continue
        try:
            made[name] = make()
        except Exception as exc:
            missing[name] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"{name} unavailable here: {missing[name]}", file=sys.stderr)
    return made, missing


def one_model(name: str, cpu: str, threads: int, rounds: int, records: str | None,
              wanted=ENGINES, precision: str = DEFAULT) -> dict:
    from network import cpu_records, load_model, spread

    path = records or cpu_records(cpu, name, threads, precision)
    if path != "none" and not os.path.exists(path):
        raise SystemExit(f"bench/layers.py: no records at {path}: tune {name} first "
                         f"(bench/network.py), name a file with --records, or --records none")
    model, inputs = load_model(name)
    inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # untuned or old records, named by compile_network
        net = compile_network(model, inputs, None if path == "none" else path,
                              threads=threads, target="llvm" if precision == DEFAULT
                              else f"llvm -precision={precision}")
    xs = net.random_inputs()
    with tempfile.TemporaryDirectory() as workdir:
        made, missing = engines(model, xs, threads, workdir, wanted, precision)
        sides = ["ours", *made]
        laps: dict[str, list] = {k: [] for k in sides}
        for r in range(rounds):
            for k in sides[r % len(sides):] + sides[: r % len(sides)]:
                with torch.no_grad():
                    laps[k].append(net._clock_steps(xs, RUNS) if k == "ours"
                                   else made[k].round(RUNS))
        if "onnxruntime" in made:
            laps["onnxruntime"] = made["onnxruntime"].rounds()
    layers = [s.layers for s in net.steps]
    kernels = [s.kind == "kernel" for s in net.steps]
    ours = np.asarray(laps["ours"])  # rounds x steps
    theirs, lost = {}, {}
    for k in made:
        attached = [attach(nodes, layers, kernels) for nodes in laps[k]]
        theirs[k] = np.asarray([a[0] for a in attached])
        lost[k] = {"us": round(median([a[1] for a in attached]) * 1e6, 1),
                   "nodes": sorted(set(n for a in attached for n in a[2]))}
    us = lambda x: round(float(np.median(x)) * 1e6, 1)  # noqa: E731
    rows = []
    for i, s in enumerate(net.steps):
        row = {"step": s.name, "kind": s.kind, "ours_us": us(ours[:, i])}
        for k in made:
            if s.layers:
                row[f"{k}_us"] = us(theirs[k][:, i])
                if theirs[k][:, i].min() > 0:
                    row[f"{k}_over_ours"] = spread(list(theirs[k][:, i] / ours[:, i]))
        best = [row[f"{k}_us"] for k in made if row.get(f"{k}_us")]
        row["behind_us"] = round(max(0.0, row["ours_us"] - min(best)), 1) if best else 0.0
        rows.append(row)
    sums = {"ours_us": us(ours.sum(1))}
    sums.update({f"{k}_us": us(theirs[k].sum(1)) for k in made})
    return {"records": os.path.relpath(path, os.path.dirname(HERE)) if records is None
            else path, "steps": rows, "sums": sums, "unattributed": lost,
            "missing": missing, "versions": {k: e.version for k, e in made.items()}}


def table(name: str, out: dict, top: int = 12) -> str:
    """The steps furthest behind the faster engine's nodes, then the sums."""
    engines_here = [k for k in ENGINES if f"{k}_us" in out["sums"]]
    head = f"{name}: ours" + "".join(f" / {k}" for k in engines_here) + " (us)"
    lines = [head]
    for row in sorted(out["steps"], key=lambda r: -r["behind_us"])[:top]:
        if row["behind_us"] <= 0:
            break
        cells = "".join(f" {row.get(f'{k}_us', 0.0):9.1f}" for k in engines_here)
        lines.append(f"  {row['step'][:36]:36s} {row['ours_us']:9.1f}{cells}  "
                     f"behind {row['behind_us']:7.1f}")
    if not engines_here:
        why = "; ".join(sorted(set(out["missing"].values())))
        lines.append(f"  no engine here ({why}); steps' sum {out['sums']['ours_us']:.1f}")
        return "\n".join(lines)
    ahead = sum(1 for r in out["steps"] if r["behind_us"] <= 0 and r["kind"] == "kernel")
    lines.append(f"  {ahead} kernels at least as fast as every engine; steps' sum "
                 f"{out['sums']['ours_us']:.1f}" + "".join(
                     f", {k} nodes' sum {out['sums'][f'{k}_us']:.1f} "
                     f"(+{out['unattributed'][k]['us']:.1f} unattributed)"
                     for k in engines_here))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--records", help="one records file (with one model), or none (untuned)")
    p.add_argument("--engines", default=",".join(ENGINES),
                   help="comma-separated, among " + ", ".join(ENGINES))
    p.add_argument("--precision", choices=(DEFAULT, "bf16"), default=DEFAULT,
                   help="bf16: our network for llvm -precision=bf16, OpenVINO in bf16")
    args = p.parse_args()
    if args.records and args.records != "none" and len(args.models) > 1:
        raise SystemExit("bench/layers.py: --records names one model's records")
    wanted = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    if not wanted or any(e not in ENGINES for e in wanted):
        raise SystemExit(f"bench/layers.py: --engines {args.engines!r}: name some of "
                         f"{', '.join(ENGINES)}")
    cpu = host_cpu()[0]
    torch.set_num_threads(args.threads)
    out = {}
    for name in args.models:
        out[name] = one_model(name, cpu, args.threads, args.rounds, args.records,
                              wanted, args.precision)
        print(table(name, out[name]), flush=True)
    print(json.dumps({"bench": "layers", "cpu": cpu, "threads": args.threads,
                      "precision": args.precision,
                      "rounds": args.rounds, "runs": RUNS, "models": out,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
