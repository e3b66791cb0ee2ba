"""Network benchmark: tune (or reuse records), compile, and time against PyTorch in one run.

    python bench/network.py resnet18 --trials 1000 --threads 2 [--records FILE]
    python bench/network.py torchvision/mobilenet_v3_large ...   # bench/models.py's names

Tunes the model's tasks with `trials` measurements at `threads` threads (a records file that
already holds them is resumed, nothing re-measured; by default
bench/results/CPU/network_MODEL_<threads>threads.jsonl, CPU being LLVM's name for this host,
so that figures of one CPU model are never taken for another's), compiles it twice (layouts
chosen by the ILP, and the best uniform layout), checks both against the model, then times,
at the same thread count and interleaved round by round: ours, ours uniform, PyTorch eager,
channels_last, TorchScript trace+freeze, torch.compile with freezing where the machine
can build it, and, from the model exported to ONNX, ONNX Runtime and OpenVINO where they are
installed (`pip install -e '.[compare]'`), each checked against eager first. Prints the
per-layer profile and the fidelity report.

    python bench/network.py resnet18 --target cuda [--trials 1000] [--records FILE]
    python bench/network.py resnet18 --target "cuda -arch=sm_90" ...

With a cuda target: tunes on the GPU (GPU measurers, NVRTC builders; records default
bench/results/GPU/network_MODEL_cuda.jsonl, GPU as gpu_folder() names it, resumed), compiles
a GpuNetwork, and times it against PyTorch on the same GPU, interleaved round by round:
eager fp32 (TF32 off, cudnn.benchmark on), channels_last and torch.compile (each baseline
that fails is reported and left out), all by CUDA events after warm-up, the median of the
repeats (raytune_kernels.cuda.torch_timing). Without a visible CUDA GPU: exit status 2. Last
line of stdout: one JSON object (with a cuda target, naming the device and target).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
import tempfile
import time

import torch

from raytune_kernels import tune_network, zoo
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.compile.api import compile_network
from raytune_kernels.target import target_arg
from raytune_kernels.tune.timing import TimingOptions, median, time_fn

FULL = TimingOptions(warmup=3, min_repeat_ms=200, repeats=5)
GPU_FULL = TimingOptions(warmup=10, min_repeat_ms=100, repeats=7)  # GpuNetwork.benchmark's


def torch_variants(model, x, use_compile: bool) -> dict:
    """name -> zero-argument callable, or None where the variant cannot be built here
    (channels_last for an input that is not an image; TorchScript or torch.compile that
    fail on the model: each such failure is reported on stderr)."""
    out = {"eager": lambda: model(x), "channels_last": None, "jit_freeze": None,
           "compile": None}

    def build(name, make):
        try:
            out[name] = make()
        except Exception as exc:  # a variant this model or machine cannot build: report
            print(f"{name} unavailable here: {type(exc).__name__}: {exc}"[:300],
                  file=sys.stderr)

    def channels_last():
        cl_model = copy.deepcopy(model).to(memory_format=torch.channels_last)
        cl_x = x.contiguous(memory_format=torch.channels_last)
        return lambda: cl_model(cl_x)

    def jit_freeze():
        with torch.no_grad():
            traced = torch.jit.trace(copy.deepcopy(model), (x,), strict=False)
            frozen = torch.jit.freeze(traced.eval())
            for _ in range(3):
                frozen(x)  # TorchScript optimises on the first calls
        return lambda: frozen(x)

    def compiled():
        import torch._inductor.config as inductor

        inductor.freezing = True
        fn = torch.compile(copy.deepcopy(model))
        with torch.no_grad():
            fn(x)
        return lambda: fn(x)

    if x.dim() == 4:  # channels_last is a memory format of images
        build("channels_last", channels_last)
    build("jit_freeze", jit_freeze)
    if use_compile:
        build("compile", compiled)
    return out


def engine_variants(model, inputs, threads: int, workdir: str) -> tuple[dict, dict, dict]:
    """What a user would pick instead on a CPU, from the model exported to ONNX once:
    ONNX Runtime (all graph optimisations, `threads` intra-op threads, one inter-op) and
    OpenVINO (CPU, LATENCY hint, f32 inference, `threads` threads). Each is checked
    against eager before it is timed. Returns name -> zero-argument callable, name ->
    version, and name -> why it is not here (not installed, export or check failed)."""
    from raytune_kernels.compile.report import output_error

    fns, versions, missing = {}, {}, {}
    path = os.path.join(workdir, "model.onnx")
    names = [f"input{i}" for i in range(len(inputs))]
    feeds = [x.numpy() for x in inputs]
    try:
        with torch.no_grad():
            torch.onnx.export(model, tuple(inputs), path, input_names=names,
                              opset_version=17, dynamo=False)
            want = model(*inputs)
    except Exception as exc:
        why = f"ONNX export failed: {type(exc).__name__}: {exc}"[:300]
        return {}, {}, {"onnxruntime": why, "openvino": why}

    def add(name, make):
        try:
            fn, version = make()
            err = output_error([torch.from_numpy(o) for o in fn()], want)
            if not err <= 1e-3:
                raise ValueError(f"its output differs from eager by {err:.3g}")
            fns[name], versions[name] = fn, version
        except Exception as exc:
            missing[name] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"{name} unavailable here: {missing[name]}", file=sys.stderr)

    def onnxruntime():
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feed = dict(zip(names, feeds))
        return (lambda: session.run(None, feed)), ort.__version__

    def openvino():
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()

        def run():
            request.infer(feeds)
            return [request.get_output_tensor(i).data.copy()
                    for i in range(len(compiled.outputs))]
        return run, ov.__version__

    add("onnxruntime", onnxruntime)
    add("openvino", openvino)
    return fns, versions, missing


def interleaved(fns: dict, rounds: int, per_round: dict | None = None) -> dict:
    """Median over rounds of each fn's median time. Each round starts one place further
    along the list: whoever runs right after ONNX Runtime or OpenVINO meets their thread
    pools still spinning, and no variant should always be the one that does. Each round's
    time of each fn goes to `per_round` when given."""
    times: dict[str, list[float]] = {k: [] for k, f in fns.items() if f is not None}
    names = list(times)
    with torch.no_grad():
        for r in range(rounds):
            shift = r % len(names)
            for k in names[shift:] + names[:shift]:
                times[k].append(median(time_fn(fns[k], FULL)))
    if per_round is not None:
        per_round.update(times)
    return {k: median(v) for k, v in times.items()}


# ------------------------------------------------------------------------------ cuda

def torch_gpu_variants(model, inputs, use_compile: bool) -> tuple[dict, dict]:
    """name -> zero-argument callable on the GPU, and name -> why a variant could not be
    built (each baseline fails alone)."""
    from raytune_kernels.cuda.torch_timing import on_gpu, torch_gpu_mode

    fns, failed = {}, {}

    def add(name, make):
        try:
            with torch.no_grad(), torch_gpu_mode():
                fn = make()
                fn()  # built and run once here: a failure is this baseline's, reported
            fns[name] = fn
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"PyTorch {name} on the GPU failed: {failed[name]}", file=sys.stderr)

    def eager():
        m, xs = on_gpu(model, inputs)
        return lambda: m(*xs)

    def channels_last():
        m, xs = on_gpu(model, inputs, channels_last=True)
        return lambda: m(*xs)

    def compiled():
        import torch._inductor.config as inductor

        inductor.freezing = True
        m, xs = on_gpu(model, inputs)
        c = torch.compile(m)
        return lambda: c(*xs)

    add("eager", eager)
    add("channels_last", channels_last)
    if use_compile:
        add("compile", compiled)
    return fns, failed


def interleaved_gpu(nets: dict, fns: dict, rounds: int) -> dict:
    """Median seconds of our networks (GpuNetwork.benchmark: random inputs) and of each
    torch callable (time_torch_gpu), the same protocol and options, alternated round by
    round."""
    from raytune_kernels.cuda.torch_timing import time_torch_gpu

    times: dict[str, list[float]] = {**{k: [] for k in nets}, **{k: [] for k in fns}}
    for _ in range(rounds):
        for k, net in nets.items():
            times[k].append(net.benchmark(GPU_FULL))
        for k, fn in fns.items():
            times[k].append(median(time_torch_gpu(fn, GPU_FULL)))
    return {k: median(v) for k, v in times.items()}


def main_cuda(args) -> int:
    """The cuda benchmark; 2 with a one-line message when it cannot run here."""
    from raytune_kernels.errors import RaytuneError
    from raytune_kernels.cuda.torch_timing import require_gpu

    try:
        gpu = require_gpu(f"--target {str(args.target)!r}")
        return bench_cuda(args, gpu)
    except RaytuneError as exc:  # no GPU here, none in Ray, no NVRTC, records missing
        print(f"bench/network.py: error: {exc}", file=sys.stderr)
        return 2


def gpu_folder(name: str) -> str:
    """bench/results/ folder of a GPU: its product name in lower case, words joined by '-',
    without the vendor ("NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3")."""
    words = re.findall(r"[a-z0-9]+", name.lower())
    return "-".join(w for w in words if w != "nvidia") or "gpu"


def bench_cuda(args, gpu: str) -> int:
    target = str(args.target)
    name = args.model.replace("/", "_")
    records = args.records or os.path.join(
        os.path.dirname(__file__), "results", gpu_folder(gpu),
        f"network_{name}_cuda.jsonl")
    model, inputs = load_model(args.model)  # random inputs (zoo: seeded randn)

    start = time.perf_counter()
    tuned = tune_network(model, inputs, target=target, trials=args.trials, records=records,
                         verbose=False)
    tune_s = time.perf_counter() - start
    import ray
    ray.shutdown()  # nothing of Ray's on the GPU while we time
    print(f"tuned {tuned.trials} trials for target {target!r} on {gpu} ({tune_s:.0f} s this "
          f"run), estimated {tuned.estimated_latency_s * 1e3:.3f} ms")

    start = time.perf_counter()
    net = compile_network(model, inputs, records, target=target, fallback=args.fallback,
                          verbose=True)
    uniform = compile_network(model, inputs, records, target=target,
                              fallback=args.fallback, layout="uniform", verbose=True)
    print(f"compiled and checked in {time.perf_counter() - start:.0f} s")

    fns, failed = torch_gpu_variants(model, inputs, not args.no_compile)
    ms = {k: v * 1e3 for k, v in
          interleaved_gpu({"ours": net, "ours_uniform": uniform}, fns, args.rounds).items()}
    print(f"{args.model} on {gpu}, target {target!r}: ours {ms['ours']:.3f} ms (layout ILP), "
          f"{ms['ours_uniform']:.3f} ms (one layout); PyTorch "
          + ", ".join(f"{k} {ms[k]:.3f} ms" if k in ms else f"{k} failed"
                      for k in ("eager", "channels_last", "compile"))
          + " (fp32, TF32 off, cudnn.benchmark on; CUDA events, median of repeats)")
    prof = net.profile(png=args.png)
    print(net.fidelity(ms["ours"] / 1e3, prof))
    torch_ms = {k: (round(ms[k], 3) if k in ms else None)
                for k in ("eager", "channels_last", "compile")}
    timed = [v for v in torch_ms.values() if v is not None]
    result = {"model": args.model, "target": target,
              "record_targets": sorted({r.target for r in tuned.best.values()}),
              "device": gpu, "trials": tuned.trials, "ours_ms": round(ms["ours"], 3),
              "ours_uniform_ms": round(ms["ours_uniform"], 3),
              "layouts": net.plan.summary(),
              "estimated_ms": round(net.estimated_s * 1e3, 3), "torch_ms": torch_ms,
              "torch_failed": failed,
              "speedup_vs_best_torch": round(min(timed) / ms["ours"], 3) if timed else None,
              "tf32": False, "cudnn_benchmark": True, "torch": torch.__version__,
              "torch_cuda": torch.version.cuda}
    print(json.dumps(result))
    return 0


# ------------------------------------------------------------------------------- main

def load_model(name: str):
    """A zoo name, path/to/file.py:factory, or a third-party model as bench/models.py
    names it (torchvision/mobilenet_v3_large, timm/..., hf/...)."""
    if "/" in name and ":" not in name:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import models
        known = models.all_models()
        if name not in known:
            raise SystemExit(f"bench/network.py: unknown model {name!r}: bench/models.py "
                             f"lists {len(known)} (python bench/models.py)")
        return known[name]()
    return zoo.load(name)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--target", type=target_arg, default="llvm",
                    help="llvm (default: this CPU), cuda (this machine's GPU) or "
                         "'cuda -arch=sm_XY'")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2, help="CPU only")
    ap.add_argument("--records", default=None, help="default bench/results/CPU/network_MODEL_"
                                                    "<threads>threads.jsonl (cuda: "
                                                    "GPU/network_MODEL_cuda.jsonl)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--fallback", choices=["torch"], default=None,
                    help="cuda only: run PyTorch's kernel for tasks without a record")
    ap.add_argument("--png", default=None, help="save the per-layer chart here")
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.target.kind == "cuda":
        sys.exit(main_cuda(args))
    if args.target.mcpu:
        print(f"bench/network.py: error: --target {str(args.target)!r}: the CPU benchmark "
              "runs on this machine's own CPU; drop -mcpu", file=sys.stderr)
        sys.exit(2)
    cpu = cpu_info().name  # records measured on one CPU model are not this one's
    records = args.records or os.path.join(
        os.path.dirname(__file__), "results", cpu,
        f"network_{args.model.replace('/', '_')}_{args.threads}threads.jsonl")
    os.makedirs(os.path.dirname(os.path.abspath(records)), exist_ok=True)
    model, inputs = load_model(args.model)
    x = inputs[0]

    start = time.perf_counter()
    tuned = tune_network(model, inputs, trials=args.trials, records=records,
                         threads=args.threads, verbose=False)
    tune_s = time.perf_counter() - start
    import ray
    ray.shutdown()  # nothing of Ray's running while we time
    torch.set_num_threads(args.threads)
    print(f"tuned {tuned.trials} trials ({tune_s:.0f} s this run), estimated "
          f"{tuned.estimated_latency_s * 1e3:.3f} ms")

    from raytune_kernels.layout.costs import COUNTS

    start = time.perf_counter()
    net = compile_network(model, inputs, records, threads=args.threads, verbose=True)
    compile_s = time.perf_counter() - start
    transforms = dict(COUNTS)  # timed now, or found in this machine's transform cache
    print(f"compiled and checked in {compile_s:.1f} s ({transforms['timed']} transforms "
          f"timed, {transforms['cached']} from the cache)")
    uniform = compile_network(model, inputs, records, threads=args.threads, layout="uniform",
                              verbose=True)

    fns = {"ours": lambda: net(*inputs), "uniform": lambda: uniform(*inputs)}
    fns.update(torch_variants(model, x, not args.no_compile))
    with tempfile.TemporaryDirectory(prefix="rk_engines_") as tmp:
        engines, engine_versions, engines_missing = engine_variants(model, inputs,
                                                                    args.threads, tmp)
    fns.update(engines)
    rounds: dict[str, list[float]] = {}
    ms = {k: v * 1e3 for k, v in interleaved(fns, args.rounds, rounds).items()}
    prof = net.profile(png=args.png)
    print(net.fidelity(ms["ours"] / 1e3, prof))
    torch_ms = {k: (round(ms[k], 3) if k in ms else None)
                for k in ("eager", "channels_last", "jit_freeze", "compile")}
    best_torch = min(v for v in torch_ms.values() if v is not None)
    engines_ms = {k: round(ms[k], 3) for k in engines}
    best_any = min([best_torch, *engines_ms.values()])
    print("ours {:.3f} ms; ".format(ms["ours"]) + ", ".join(
        f"{k} {v:.3f} ms" for k, v in {**torch_ms, **engines_ms}.items() if v is not None))
    result = {"model": args.model, "cpu": cpu, "threads": args.threads, "trials": tuned.trials,
              "ours_ms": round(ms["ours"], 3), "uniform_ms": round(ms["uniform"], 3),
              "estimated_ms": round(net.estimated_s * 1e3, 3),
              "layout_plan_ms": round(net.plan.cost * 1e3, 3),
              "torch_ms": torch_ms, "speedup_vs_best_torch": round(best_torch / ms["ours"], 3),
              "engines_ms": engines_ms, "engine_versions": engine_versions,
              "engines_missing": engines_missing,
              # over the best of the PyTorch variants and the engines that ran here
              "speedup_vs_best_engine": round(best_any / ms["ours"], 3),
              # the ILP compile, checked; transforms timed then or found in the cache
              "compile_s": round(compile_s, 1), "compile_transforms": transforms,
              # every round's time of every variant (the figures above are their medians):
              # this VM's timings drift, and a figure is only as good as its spread
              "rounds_ms": {k: [round(t * 1e3, 3) for t in v] for k, v in rounds.items()}}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
