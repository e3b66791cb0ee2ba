"""The `raytune-kernels` command line."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from raytune_kernels.errors import RaytuneError


STRICT = ("refuse ops without a kernel of ours (by default they run in PyTorch, "
          "as islands named in one warning)")
RECORDS = ("records: a JSON-lines file, or a record store (a local directory, or a URI: "
           "file://, s3://, gs://)")


def _layers(layers: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(layers[:limit])
    return shown + (f" (+{len(layers) - limit} more)" if len(layers) > limit else "")


def format_tasks(tasks: Sequence, target: str) -> str:
    """The task table: one row per task, then the totals."""
    header = f"{'id':>3}  {'key':<16}  {'weight':>6}  {'GFLOP':>8}  {'compute':<50}  layers"
    rows = [f"Tasks for target {target}", header, "-" * len(header)]
    for i, t in enumerate(tasks):
        rows.append(f"{i:>3}  {t.key:<16}  {t.weight:>6}  {t.flops / 1e9:>8.4f}  "
                    f"{t.compute.describe()[:50]:<50}  {_layers(t.layers)}")
    total = sum(t.weight * t.flops for t in tasks) / 1e9
    rows.append("-" * len(header))
    rows.append(f"{len(tasks)} tasks, {sum(t.weight for t in tasks)} layers, "
                f"{total:.3f} GFLOP per inference (weighted)")
    return "\n".join(rows)


def cmd_tasks(args: argparse.Namespace) -> int:
    from raytune_kernels import extract_tasks, parse_target, zoo

    target = parse_target(args.target)  # a bad target fails before the model is built
    model, inputs = zoo.load(args.model)
    print(format_tasks(extract_tasks(model, inputs, target=target, strict=args.strict),
                       str(target)))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from raytune_kernels import parse_target, tune_network, zoo

    parse_target(args.target)  # a bad target fails before the model is built
    model, inputs = zoo.load(args.model)
    result = tune_network(model, inputs, target=args.target, trials=args.trials,
                          records=args.records, resume=not args.no_resume,
                          address=args.address, num_measurers=args.measurers,
                          num_builders=args.builders, search_actors=args.search_actors,
                          batch=args.batch, seed=args.seed,
                          threads=args.threads, strict=args.strict, seconds=args.seconds)
    return 0 if result.best else 1


def cmd_compile(args: argparse.Namespace) -> int:
    import torch

    from raytune_kernels import parse_target, zoo
    from raytune_kernels.compile.api import compile_network
    from raytune_kernels.precision import tolerance
    from raytune_kernels.tune.records import missing_records
    from raytune_kernels.timing import TimingOptions, median, time_fn

    tgt = parse_target(args.target)
    if args.threads < 1:
        raise ValueError(f"threads must be a positive integer, got {args.threads}")
    if args.refine < 0:
        raise ValueError(f"refine must be a count of records (0: off), got {args.refine}")
    problem = missing_records(args.records)
    if problem:
        print(f"raytune-kernels: error: {problem}", file=sys.stderr)
        return 2
    gpu = None
    if tgt.kind == "cuda":  # the network runs on the GPU: fail before building anything
        from raytune_kernels.cuda.torch_timing import require_gpu

        gpu = require_gpu(f"target {str(tgt)!r}")
    torch.set_num_threads(args.threads)
    model, inputs = zoo.load(args.model)
    net = compile_network(model, inputs, args.records, target=args.target,
                          fallback=args.fallback, threads=args.threads,
                          layout="uniform" if args.uniform else "ilp", verbose=True,
                          refine=args.refine)
    ours = net.benchmark()
    if gpu is not None:  # PyTorch on the same GPU, clocked as ours (GpuNetwork.benchmark):
        # CUDA events, the same warm-up and repeats, TF32 off
        from raytune_kernels.cuda.torch_timing import on_gpu, time_torch_gpu

        gmodel, gx = on_gpu(model, inputs)
        eager = median(time_torch_gpu(lambda: gmodel(*gx), TimingOptions(10, 100, 7)))
        where = f"on {gpu} (target {tgt}), CUDA events, TF32 off"
    else:
        with torch.no_grad():
            eager = median(time_fn(lambda: model(*inputs), TimingOptions(3, 200, 7)))
        where = f"on the CPU, {args.threads} thread(s)"
    atol = getattr(net, "checked_within", tolerance(tgt.precision).network)
    print(f"checked against the model (difference <= {atol:.3g} of the output's scale)\n"
          f"ours {ours * 1e3:.3f} ms, PyTorch eager {eager * 1e3:.3f} ms "
          f"({eager / ours:.2f}x), {where}")
    prof = net.profile(png=args.png, end_to_end=ours) if (args.profile or args.png) else None
    print(net.fidelity(ours, prof))
    if args.output:
        net.save(args.output)
        print(f"saved to {args.output} ({os.path.getsize(args.output) / 2**20:.1f} MiB): "
              f"raytune-kernels run {args.output} --benchmark")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Load a saved network, run it once on random inputs of its shapes, and time it."""
    import time

    import torch

    from raytune_kernels.compile.api import load

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    net = load(args.file)
    loaded = time.perf_counter() - start
    outs = net(*net.random_inputs())
    shapes = [tuple(o.shape) for o in (outs if isinstance(outs, tuple) else (outs,))]
    print(f"loaded {args.file} in {loaded:.3f} s; output shape(s) {shapes}")
    if args.benchmark:
        print(f"{net.benchmark() * 1e3:.3f} ms per inference (median of repeats)")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from raytune_kernels.tune.plot import plot_records

    weights = None
    if args.model:  # the tuner's estimate: each task weighed by the layers sharing it
        from raytune_kernels import extract_tasks, zoo

        model, inputs = zoo.load(args.model)
        weights = {t.key: t.weight for t in extract_tasks(model, inputs)}
    print(f"wrote {plot_records(args.file, args.output, weights)}")
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    from raytune_kernels.tune.records import distill, load_records, missing_records

    problem = missing_records(args.file)
    if problem:
        print(f"raytune-kernels: error: {problem}", file=sys.stderr)
        return 2
    kept = distill(args.file, args.output, args.top)
    total = len(load_records(args.output).records)
    print(f"kept {kept} record(s) ({total} in {args.output}): the best {args.top} per "
          "task, target, thread count and layout")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raytune-kernels",
                                     description="Tune the kernels of a PyTorch network.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tasks", help="list the weighted tasks of a model")
    p.add_argument("model", help="zoo name (resnet18, resnet50, mobilenet_v2, bert_layer) "
                                 "or path/to/file.py:factory")
    p.add_argument("--target", default="llvm", help="llvm, 'llvm -mcpu=NAME' or cuda")
    p.add_argument("--strict", action="store_true", help=STRICT)
    p.set_defaults(func=cmd_tasks)
    p = sub.add_parser("tune", help="tune a model's tasks on a local Ray or a cluster")
    p.add_argument("model", help="zoo name or path/to/file.py:factory")
    p.add_argument("--target", default="llvm",
                   help="llvm, 'llvm -mcpu=NAME', cuda (the GPU's own arch) or "
                        "'cuda -arch=sm_XY', with -precision=tf32|fp16|bf16 for tensor "
                        "cores (default fp32)")
    p.add_argument("--trials", type=int, default=200, help="measurement budget (all tasks)")
    p.add_argument("--seconds", type=float, default=None,
                   help="time budget as well: no round starts this long after the first")
    p.add_argument("--records", default=None, help=f"{RECORDS}, resumed")
    p.add_argument("--no-resume", action="store_true", help="ignore what --records holds")
    p.add_argument("--address", default=None, help="Ray cluster address (default: local)")
    p.add_argument("--measurers", type=int, default=None)
    p.add_argument("--builders", type=int, default=None)
    p.add_argument("--search-actors", type=int, default=None,
                   help="processes proposing candidates (default: 1; on a cluster one per "
                        "node, at most 8)")
    p.add_argument("--batch", type=int, default=8, help="candidates per round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="threads per candidate (each measurer owns that many cores)")
    p.add_argument("--strict", action="store_true", help=STRICT)
    p.set_defaults(func=cmd_tune)
    p = sub.add_parser("compile", help="compile a model from its records, check it and "
                                       "time it against PyTorch")
    p.add_argument("model", help="zoo name or path/to/file.py:factory")
    p.add_argument("--records", required=True, help=RECORDS)
    p.add_argument("--target", default="llvm",
                   help="llvm, 'llvm -mcpu=NAME', cuda (this machine's GPU) or "
                        "'cuda -arch=sm_XY', with -precision=tf32|fp16|bf16 as tuned; "
                        "a cuda network runs and is timed on the GPU")
    p.add_argument("--threads", type=int, default=1,
                   help="threads, as the records were measured with (default 1; CPU only)")
    p.add_argument("--fallback", choices=["torch"], default=None,
                   help="run PyTorch's kernel where no tuned kernel is faster")
    p.add_argument("--uniform", action="store_true",
                   help="one layout for the whole network instead of the ILP's choice")
    p.add_argument("--refine", type=int, default=8,
                   help="CPU: clock up to N of each step's best records inside the running "
                        "network and keep the fastest (default 8; 0 skips it)")
    p.add_argument("--profile", action="store_true", help="print the per-layer table")
    p.add_argument("--png", default=None, help="save the per-layer bar chart here")
    p.add_argument("-o", "--output", default=None,
                   help="save the compiled network to this file (raytune-kernels run FILE, "
                        "or raytune_kernels.load(FILE))")
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("run", help="load a saved network and run it (no Ray, records or "
                                   "tuning stack needed)")
    p.add_argument("file", help="a file written by compile -o or net.save()")
    p.add_argument("--benchmark", action="store_true", help="time it: median ms per call")
    p.add_argument("--threads", type=int, default=None,
                   help="PyTorch's threads for its steps (the kernels use the compiled count)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("plot", help="draw tuning curves from records (PNG)")
    p.add_argument("file", help=RECORDS)
    p.add_argument("-o", "--output", default="curve.png")
    p.add_argument("--model", default=None,
                   help="zoo name or path/to/file.py:factory: draw only its tasks, and the "
                        "estimated latency with each task's weight")
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("distill", help="keep only the best records of each task (per target, "
                       "threads and layout)")
    p.add_argument("file", help=RECORDS)
    p.add_argument("-o", "--output", required=True,
                   help="where to write the best records: a file (replaced) or a new store")
    p.add_argument("--top", type=int, default=1, help="records kept per task (default 1)")
    p.set_defaults(func=cmd_distill)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RaytuneError, OSError, ValueError) as exc:
        print(f"raytune-kernels: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
