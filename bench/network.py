"""Network benchmark: tune (or reuse records), compile, and time against PyTorch in one run.

    python bench/network.py resnet18 --trials 1000 --threads 2 [--records FILE]
    python bench/network.py torchvision/mobilenet_v3_large ...   # bench/models.py's names

Tunes the model's tasks with `trials` measurements at `threads` threads (a records file that
already holds them is resumed, nothing re-measured; by default
bench/results/CPU/network_MODEL_<threads>threads.jsonl, CPU being LLVM's name for this host,
so that figures of one CPU model are never taken for another's), compiles it twice (layouts
chosen by the ILP, and the best uniform layout), checks both against the model, then times,
at the same thread count and interleaved round by round: ours, ours uniform, ours without
compile_network's in-network refinement (--refine 0 skips it, and this variant), PyTorch
eager, channels_last, TorchScript trace+freeze, torch.compile with freezing where the machine
can build it, and, from the model exported to ONNX, ONNX Runtime and OpenVINO where they are
installed (`pip install -e '.[compare]'`), each checked against eager first; on a CPU with
bf16 arithmetic (AMX, AVX512-BF16) also PyTorch eager and torch.compile in bf16 and
OpenVINO in bf16 (its default there), as users of such a CPU run them. Prints the
per-layer profile and the fidelity report. With --max-rounds M, rounds go on past --rounds
(up to M) until the median of per-round ratios against the best other variant is known
within --ci of itself (a ~95% interval, reported as ci95 with the rounds it took): on a
machine whose timings drift, a ratio is only as good as its interval. The JSON's
speedup_vs_best_engine is over the fastest variant of any precision; speedup_vs_best_
same_precision and _any split it by our target's precision.

    python bench/network.py resnet18 --target "llvm -precision=bf16" --threads 2

In bf16 the CPU's convolutions may also run on AMX tiles (records default
bench/results/CPU/network_MODEL_<threads>threads_bf16.jsonl).

    python bench/network.py resnet18 --target cuda [--trials 1000] [--records FILE]
    python bench/network.py resnet18 --target "cuda -arch=sm_90 -precision=tf32" ...
    python bench/network.py hf/BertModel --target cuda --precision fp16 ...
    python bench/network.py resnet18 --target cuda --precision tf32,fp16,fp32,bf16 --quick

With a cuda target: tunes on the GPU (GPU measurers, NVRTC builders; records default
bench/results/GPU/network_MODEL_cuda[_PRECISION].jsonl, GPU as gpu_folder() names it, fp32
left out of the name, resumed) in the target's precision (--precision or the target's
-precision=; fp32 by default), compiles a GpuNetwork (one CUDA graph), and times it against
what users run in PyTorch on the same GPU, in the same process, interleaved round by round
by CUDA events (raytune_kernels.cuda.torch_timing): eager, eager captured in one CUDA
graph, torch.compile and its mode="reduce-overhead", each in fp32 (TF32 off), tf32 (TF32
on), fp16 and bf16 (model cast, images channels_last). A variant that fails to build is
reported and left out. Every output's error, of the output's scale, is taken against fp64
eager on the CPU. The JSON compares ours with the fastest variant of our precision and
with the fastest of any (one whose output is not finite does not count), by the medians
and by per-round ratios (median, min, max), and ours end to end with the sum of its steps
each timed alone (`steps_alone_ms`, `ours_over_steps`; briefly with --quick). Without a
visible CUDA GPU: exit status 2. Last line of stdout: one JSON object (with a cuda target,
naming the device and target); with several cuda precisions, one such line per precision,
in the order given, each tuned and compiled in turn, all timed interleaved in one run.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
import time

import torch

from raytune_kernels import tune_network, zoo
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.compile.api import compile_network
from raytune_kernels.compile.report import machine_drift, network_bound
from raytune_kernels.precision import DEFAULT, PRECISIONS, tolerance
from raytune_kernels.target import Target, target_arg
from raytune_kernels.timing import TimingOptions, median, time_fn

FULL = TimingOptions(warmup=3, min_repeat_ms=200, repeats=5)
OURS = ("ours", "uniform", "unrefined")  # our own variants: never "the best other"
GPU_FULL = TimingOptions(warmup=10, min_repeat_ms=100, repeats=7)  # GpuNetwork.benchmark's
GPU_QUICK = TimingOptions(warmup=3, min_repeat_ms=10, repeats=3)  # --quick: a check only
GPU_STEPS = TimingOptions(warmup=2, min_repeat_ms=2, repeats=3)  # --quick: each step alone
SLOWEST = 10  # steps the cuda report names, slowest alone first


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


def bf16_variants(model, x, use_compile: bool, atol: float | None = None) -> dict:
    """PyTorch in bfloat16 on a CPU that computes in it (oneDNN on AMX or AVX512-BF16):
    the model and a float input cast (integer inputs, token ids, stay), images
    channels_last; eager, and torch.compile with freezing. Each is checked against eager
    float32 within `atol` (by default bf16's network tolerance) before it is timed.
    name -> callable returning float32 outputs, or None where it cannot be built or fails
    its check (and on a CPU without bf16 arithmetic, where PyTorch would emulate it,
    slower than float32)."""
    from torch.utils import _pytree as pytree

    from raytune_kernels.compile.report import output_error

    out = {"eager_bf16": None, "compile_bf16": None}
    if not torch.backends.mkldnn.is_available() or \
            not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("eager_bf16 unavailable here: this CPU has no bf16 arithmetic",
              file=sys.stderr)
        return out
    image = x.dim() == 4 and x.is_floating_point()
    fmt = torch.channels_last if image else torch.contiguous_format
    m16 = copy.deepcopy(model).to(torch.bfloat16).to(memory_format=fmt)
    x16 = x.to(torch.bfloat16).contiguous(memory_format=fmt) if x.is_floating_point() else x
    with torch.no_grad():
        want = model(x)

    def build(name, make):
        try:
            fn = make()
            with torch.no_grad():
                err = output_error(tuple(pytree.tree_flatten(fn())[0]), want)
            if not err <= (tolerance("bf16").network if atol is None else atol):
                raise ValueError(f"its output differs from eager by {err:.3g}")
            out[name] = fn
        except Exception as exc:
            print(f"{name} unavailable here: {type(exc).__name__}: {exc}"[:300],
                  file=sys.stderr)

    def compiled():
        import torch._inductor.config as inductor

        inductor.freezing = True
        fn = torch.compile(copy.deepcopy(m16))
        with torch.no_grad():
            fn(x16)
        return lambda: as_float32(fn(x16))

    build("eager_bf16", lambda: lambda: as_float32(m16(x16)))
    if use_compile:
        build("compile_bf16", compiled)
    return out


def as_float32(out):
    """A model's outputs (a tensor, tuple or dict of them) with floating tensors in
    float32, as the float32 variants return them."""
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda t: t.float() if isinstance(t, torch.Tensor)
                           and t.is_floating_point() else t, out)


class _Flat(torch.nn.Module):
    """`model` called with its inputs as given, returning its output tensors flattened as
    capture flattens them: the TorchScript ONNX exporter passes a Hugging Face model's
    config flags (use_cache) beside positional inputs otherwise, and it exports tensors
    and tuples of them, not ModelOutputs."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        # the exporter restores this module's mode, recursively, when it is done: a new
        # module's (training) would leave the model with its dropout on
        self.train(model.training)

    def forward(self, *inputs):
        from torch.utils import _pytree as pytree

        return tuple(pytree.tree_flatten(self.model(*inputs))[0])


def export_onnx(model, inputs, path: str) -> list[str]:
    """`model` at `inputs` to ONNX at `path` (the TorchScript exporter, opset 17, outputs
    flattened: _Flat); the graph's input names."""
    names = [f"input{i}" for i in range(len(inputs))]
    with torch.no_grad():
        torch.onnx.export(_Flat(model), tuple(inputs), path, input_names=names,
                          opset_version=17, dynamo=False)
    return names


def engine_variants(model, inputs, threads: int, workdir: str, bf16_atol: float | None = None
                    ) -> tuple[dict, dict, dict]:
    """What a user would pick instead on a CPU, from the model exported to ONNX once:
    ONNX Runtime (all graph optimisations, `threads` intra-op threads, one inter-op) and
    OpenVINO (CPU, LATENCY hint, `threads` threads) in f32 inference, and OpenVINO in
    bf16 (openvino_bf16; its own default on a CPU with bf16 arithmetic, AMX or
    AVX512-BF16) where this CPU has it. Each is checked against eager before it is timed
    (bf16 within `bf16_atol`, by default that precision's network tolerance). Returns
    name -> zero-argument callable, name -> version, and name -> why it is not here (not
    installed, export or check failed, no bf16 here)."""
    from raytune_kernels.compile.report import output_error

    fns, versions, missing = {}, {}, {}
    path = os.path.join(workdir, "model.onnx")
    feeds = [x.numpy() for x in inputs]
    try:
        names = export_onnx(model, inputs, path)
        with torch.no_grad():
            want = model(*inputs)
    except Exception as exc:
        why = f"ONNX export failed: {type(exc).__name__}: {exc}"[:300]
        return {}, {}, {"onnxruntime": why, "openvino": why, "openvino_bf16": why}

    def add(name, make, atol: float = 1e-3):
        try:
            fn, version = make()
            err = output_error([torch.from_numpy(o) for o in fn()], want)
            if not err <= atol:
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

    def openvino(precision: str = "f32"):
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": precision})
        got = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        if got != precision:  # OpenVINO falls back to f32 where a CPU lacks bf16
            raise ValueError(f"OpenVINO infers in {got} on this CPU, not {precision}")
        request = compiled.create_infer_request()

        def run():
            request.infer(feeds)
            return [request.get_output_tensor(i).data.copy()
                    for i in range(len(compiled.outputs))]
        return run, ov.__version__

    add("onnxruntime", onnxruntime)
    add("openvino", openvino)
    add("openvino_bf16", lambda: openvino("bf16"),
        tolerance("bf16").network if bf16_atol is None else bf16_atol)
    return fns, versions, missing


def rotated(names: list, r: int) -> list:
    """Round r's order: one place further along each round, so that no variant always
    runs right after the same one."""
    shift = r % len(names) if names else 0
    return names[shift:] + names[:shift]


def interleaved(fns: dict, rounds: int, per_round: dict | None = None,
                unsettled=None, max_rounds: int = 0) -> dict:
    """Median over rounds of each fn's median time. Each round starts one place further
    along the list: whoever runs right after ONNX Runtime or OpenVINO meets their thread
    pools still spinning, and no variant should always be the one that does. Each round's
    time of each fn goes to `per_round` when given. After `rounds` rounds, more are run,
    up to `max_rounds` in all, while `unsettled(times)` says the figure is not yet stable."""
    times: dict[str, list[float]] = {k: [] for k, f in fns.items() if f is not None}
    names = list(times)
    with torch.no_grad():
        r = 0
        while r < rounds or (unsettled is not None and r < max_rounds and unsettled(times)):
            for k in rotated(names, r):
                times[k].append(median(time_fn(fns[k], FULL)))
            r += 1
    if per_round is not None:
        per_round.update(times)
    return {k: median(v) for k, v in times.items()}


# ------------------------------------------------------------------------------ cuda

def with_precision(target: Target, precision: str | None) -> Target:
    """`target` at --precision: the target string's own -precision where the flag is not
    given; a flag that names another precision than the string does is an error."""
    if precision is None or precision == target.precision:
        return target
    if target.kind != "cuda":
        raise ValueError(f"--precision {precision}: a cuda option (on a CPU, one precision "
                         "a run: --target 'llvm -precision=bf16')")
    if target.precision != DEFAULT:
        raise ValueError(f"--precision {precision} contradicts the target's "
                         f"-precision={target.precision}")
    return dataclasses.replace(target, precision=precision)


def cpu_records(cpu: str, model: str, threads: int, precision: str = DEFAULT) -> str:
    """bench/results/<CPU>/network_MODEL_<threads>threads[_PRECISION].jsonl: a CPU's
    records (CPU as LLVM names it; fp32 left out of the name), which the CPU benchmarks
    resume or compile from by default."""
    suffix = "" if precision == DEFAULT else f"_{precision}"
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", cpu,
                        f"network_{model.replace('/', '_')}_{threads}threads{suffix}.jsonl")


def default_records(gpu: str, model: str, precision: str) -> str:
    """bench/results/<GPU>/network_MODEL_cuda[_PRECISION].jsonl: fp32 is left out of the
    name as it is left out of target strings, so fp32 records keep their file."""
    suffix = "" if precision == DEFAULT else f"_{precision}"
    return os.path.join(os.path.dirname(__file__), "results", gpu_folder(gpu),
                        f"network_{model.replace('/', '_')}_cuda{suffix}.jsonl")


def reference_output(model, inputs) -> tuple[object, str]:
    """The model's output in float64 eager on the CPU, the yardstick of every variant's
    error (float32 eager where the model refuses float64), and which of the two it is."""
    try:
        m = copy.deepcopy(model).double()
        xs = [x.double() if x.is_floating_point() else x for x in inputs]
        with torch.no_grad():
            return m(*xs), "fp64 eager on the CPU"
    except Exception as exc:
        print(f"fp64 reference failed ({type(exc).__name__}: {exc}"[:300] + "); fp32 instead",
              file=sys.stderr)
        with torch.no_grad():
            return model(*inputs), "fp32 eager on the CPU"


def output_error_of(out, want) -> float:
    """A variant's output (any pytree of tensors, any dtype or device) against `want`, of
    the output's scale (NaN where they do not line up or one is not finite)."""
    from torch.utils import _pytree as pytree

    from raytune_kernels.compile.report import output_error

    return output_error(tuple(pytree.tree_leaves(out)), want)


def interleaved_gpu(timers: dict, rounds: int) -> dict[str, list[float]]:
    """Each timer's seconds (a zero-argument callable) in every round, alternated round by
    round, so that drift falls on every variant alike."""
    times: dict[str, list[float]] = {k: [] for k in timers}
    for r in range(rounds):
        for k in rotated(list(timers), r):
            times[k].append(timers[k]())
    return times


def gpu_timers(nets: dict, fns: dict, precisions: dict, opts: TimingOptions) -> dict:
    """Our networks (GpuNetwork.benchmark: random inputs on the device) and each torch
    callable (time_torch_gpu in its own precision's mode), the same protocol and options."""
    from raytune_kernels.cuda.torch_timing import time_torch_gpu

    timers = {k: (lambda n=net: n.benchmark(opts)) for k, net in nets.items()}
    timers.update({k: (lambda f=fn, p=precisions[k]: median(time_torch_gpu(f, opts,
                                                                            precision=p)))
                   for k, fn in fns.items()})
    return timers


def by_precision(precisions: dict[str, str]) -> dict[str, list[str]]:
    """Variant names grouped by their precision, in the order given."""
    groups: dict[str, list[str]] = {}
    for name, p in precisions.items():
        groups.setdefault(p, []).append(name)
    return groups


def fastest(ms: dict[str, float], names) -> str | None:
    """The name among `names` with the lowest finite time in `ms`; None if none has one."""
    timed = [n for n in names if math.isfinite(ms.get(n, math.nan))]
    return min(timed, key=ms.__getitem__, default=None)


def spread(ratios: list[float]) -> dict:
    """Median, min and max of per-round ratios: a figure is only as good as its spread;
    from 6 rounds on, also the ~95% interval of the median (median_ci)."""
    out = {"median": round(median(ratios), 3), "min": round(min(ratios), 3),
           "max": round(max(ratios), 3)}
    ci = median_ci(ratios)
    if ci is not None:
        out.update(ci95=[round(ci[0], 3), round(ci[1], 3)], rounds=len(ratios))
    return out


def median_ci(values: list[float]) -> tuple[float, float] | None:
    """A distribution-free ~95% confidence interval of the median of `values`: the order
    statistics n/2 -+ 0.98 sqrt(n) (the binomial's normal approximation); None under 6
    values, where it would be the whole range."""
    n = len(values)
    if n < 6:
        return None
    xs, half = sorted(values), 0.98 * math.sqrt(n)
    return xs[max(0, math.floor(n / 2 - half))], xs[min(n - 1, math.ceil(n / 2 + half) - 1)]


def unsettled(ratios: list[float], half_width: float) -> bool:
    """Whether the median of per-round ratios is still unsure by more than `half_width`
    of itself either way (its ~95% interval; always, under 6 rounds)."""
    ci = median_ci(ratios)
    return ci is None or (ci[1] - ci[0]) / 2 > half_width * median(ratios)


def refined_fields(refined) -> dict | None:
    """compile_network's refine report as JSON (None: it did not run)."""
    if refined is None:
        return None
    return {"variants": refined.variants, "steps": refined.steps,
            "changed": len(refined.changed), "seconds": round(refined.seconds, 1),
            "clocked_before_ms": round(refined.before_s * 1e3, 3),
            "clocked_after_ms": round(refined.after_s * 1e3, 3),
            "end_to_end": None if refined.speedup is None else round(refined.speedup, 3),
            "recalled": refined.recalled}


def weighing_fields(report) -> dict | None:
    """compile_network's split agreement, layout weighing or NHWC reads report as JSON
    (None: it did not run): the steps it weighed, what it kept, the kept network over the
    given one; for the split agreement, also its reordered kernels offered and kept."""
    if report is None:
        return None
    out = {"steps": report.steps, "kept": report.kept, "seconds": round(report.seconds, 1),
           "end_to_end": None if report.speedup is None else round(report.speedup, 3),
           "recalled": report.recalled}
    if hasattr(report, "reordered"):  # the split agreement's second pass
        out.update(reordered=report.reordered, reordered_kept=report.reordered_kept)
    return out


def best_other_ratios(rounds_s: dict[str, list[float]]) -> list[float]:
    """Per round, the fastest variant other than ours (and our single-layout plan) over
    ours: above 1, ours is faster."""
    others = [k for k in rounds_s if k not in OURS]
    return [min(rounds_s[k][r] for k in others) / t for r, t in enumerate(rounds_s["ours"])]


def speedups(rounds_s: dict[str, list[float]], precisions: dict[str, str], precision: str,
             ours: str = "ours") -> dict:
    """The JSON's comparison: the best variant (lowest median) of our precision and of any
    precision among `precisions`, our speedup over each (their median / ours), and the
    spread of the per-round ratios (their round r / our round r)."""
    ms = {k: median(v) for k, v in rounds_s.items() if k in precisions}
    out = {}
    for key, names in (("same_precision", by_precision(precisions).get(precision, [])),
                       ("any", list(precisions))):
        best = fastest(ms, names)
        ratios = [t / o for t, o in zip(rounds_s[best], rounds_s[ours])] if best else []
        out[f"best_{key}"] = best
        out[f"speedup_vs_best_{key}"] = (round(ms[best] / median(rounds_s[ours]), 3)
                                         if best else None)
        out[f"speedup_vs_best_{key}_rounds"] = spread(ratios) if best else None
    return out


def finite3(x: float) -> float | None:
    """Three significant digits for the JSON; None for NaN or infinity (not JSON)."""
    return float(f"{x:.3g}") if math.isfinite(x) else None


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


def tune_gpu(args, model, inputs, target: Target, records: str, gpu: str):
    """Tune `target` (resuming `records`) in the running Ray, or one it starts; a precision
    left out of --tune-precisions takes the records as they are, without Ray."""
    if target.precision not in args.tune_precisions:
        return records_as_they_are(target, records)
    start, since = time.perf_counter(), time.time()
    tuned = tune_network(model, inputs, target=str(target), trials=args.trials,
                         records=records, verbose=False, seconds=args.tune_seconds)
    print(f"tuned {tuned.trials} trials for target {str(target)!r} on {gpu} "
          f"({time.perf_counter() - start:.0f} s this run), estimated "
          f"{tuned.estimated_latency_s * 1e3:.3f} ms{measuring(records, since)}")
    return tuned


def measuring(records: str, since: float) -> str:
    """What measuring this run's candidates took, from their records (written since
    `since`, epoch seconds): ", N measured, median M ms each (build B ms)", or ""."""
    from raytune_kernels.tune.records import load_records

    new = [r for r in load_records(records).records if r.timestamp >= since]
    if not new:
        return ""
    return (f", {len(new)} measured, median {median([r.run_s for r in new]) * 1e3:.0f} ms "
            f"each (build {median([r.build_s for r in new]) * 1e3:.0f} ms)")


def records_as_they_are(target: Target, path: str):
    """A TuningResult of `path`'s records in `target`'s precision, none measured here (no
    file: none; the network then runs untuned defaults); its estimate is left to the
    compile."""
    from raytune_kernels.target import parse_target
    from raytune_kernels.tune.records import best_per_task, load_records
    from raytune_kernels.tune.result import TuningResult

    recs = [r for r in (load_records(path) if os.path.exists(path) else ())
            if parse_target(r.target).precision == target.precision]
    print(f"not tuned: {len(recs)} records for target {str(target)!r} as they are")
    return TuningResult(best=best_per_task(recs), estimated_latency_s=math.nan,
                        records=path, trials=len(recs))


def compile_gpu(args, model, inputs, target: Target, records: str) -> dict:
    """name -> GpuNetwork: the network (and, unless --quick, the one-layout network it
    must beat), compiled and checked."""
    start = time.perf_counter()
    layouts = ("ilp",) if args.quick else ("ilp", "uniform")
    nets = {name: compile_network(model, inputs, records, target=str(target),
                                  fallback=args.fallback, layout=layout, verbose=True)
            for name, layout in zip(("ours", "ours_uniform"), layouts)}
    if target.precision in args.plain:  # the plan without its rewrites, timed beside it
        nets["ours_plain"] = compile_network(model, inputs, records, target=str(target),
                                             fallback=args.fallback, verbose=True,
                                             rewrites=False)
    print(f"compiled and checked in {time.perf_counter() - start:.0f} s")
    return nets


def print_gpu_table(ms: dict, precisions: dict, errors: dict) -> None:
    """One line per variant: its precision, median ms, its time over ours, its error."""
    for k, t in ms.items():
        err = f"{errors[k]:.2g}" if k in errors else "-"
        print(f"  {k:<20} {precisions.get(k, '-'):<5} {t:8.3f} ms  ours {t / ms['ours']:.2f}x as "
              f"fast  error {err}")


def bench_cuda(args, gpu: str) -> int:
    """Every precision asked, in one process: each tuned (one Ray for all), then compiled;
    PyTorch's baselines built once; ours in each precision and the baselines timed
    interleaved together; then one report and JSON line per precision. Of several, one
    that fails to tune or compile gets a JSON line naming why, and the others go on."""
    from raytune_kernels.cuda.torch_timing import build_variants, gpu_variants
    from raytune_kernels.errors import RaytuneError

    targets = args.targets
    model, inputs = load_model(args.model)  # random inputs (zoo: seeded randn)
    records = {}
    for t in targets:
        records[t.precision] = args.records or default_records(gpu, args.model, t.precision)
        os.makedirs(os.path.dirname(os.path.abspath(records[t.precision])), exist_ok=True)
    lost: dict[str, str] = {}  # precision -> why it has no network (the others go on)

    def each(targets, step):
        out = {}
        for t in targets:
            try:
                out[t.precision] = step(t)
            except RaytuneError as exc:
                if len(args.targets) == 1:
                    raise
                lost[t.precision] = f"{type(exc).__name__}: {exc}"[:500]
                print(f"bench/network.py: {t}: {lost[t.precision]}", file=sys.stderr)
        return out
    tuned = each(targets, lambda t: tune_gpu(args, model, inputs, t, records[t.precision],
                                             gpu))
    import ray
    ray.shutdown()  # nothing of Ray's on the GPU while we time
    nets = each([t for t in targets if t.precision in tuned],
                lambda t: compile_gpu(args, model, inputs, t, records[t.precision]))
    want, yardstick = reference_output(model, inputs)
    variants = gpu_variants(not args.no_compile, args.compile_precisions)
    fns, failed, errors = build_variants(model, inputs, variants,
                                         lambda out: output_error_of(out, want))
    precisions = {v.name: v.precision for v in variants if v.name in fns}
    opts = GPU_QUICK if args.quick else GPU_FULL
    ours = {f"{name}@{p}": net for p, named in nets.items() for name, net in named.items()}
    every = interleaved_gpu(gpu_timers(ours, fns, precisions, opts), args.rounds)
    for t in targets:
        p = t.precision
        if p in lost:
            print(json.dumps({"model": args.model, "target": str(t), "precision": p,
                              "device": gpu, "error": lost[p]}), flush=True)
            continue
        rounds = {name: every[f"{name}@{p}"] for name in nets[p]} | \
            {k: every[k] for k in fns}
        mine = {"ours": output_error_of(nets[p]["ours"](*inputs), want), **errors}
        report_cuda(args, gpu, t, tuned[p], nets[p], rounds, precisions, mine, failed,
                    yardstick)
    return 0


def report_cuda(args, gpu: str, target: Target, tuned, nets: dict, rounds: dict,
                precisions: dict, errors: dict, failed: dict, yardstick: str) -> None:
    """One precision's table, its steps timed alone, and its JSON line."""
    precision = target.precision
    ms = {k: median(v) * 1e3 for k, v in rounds.items()}
    print(f"{args.model} on {gpu}, target {str(target)!r}; errors against {yardstick}, "
          "of the output's scale; CUDA events, median of repeats, median over rounds:")
    print_gpu_table(ms, {k: precision for k in nets} | precisions, errors)
    if args.quick:  # each step alone, briefly: what end to end is held to (sum of steps)
        prof = nets["ours"].profile(print_table=False, with_torch=False, opts=GPU_STEPS,
                                    end_to_end=ms["ours"] / 1e3)
    else:
        prof = nets["ours"].profile(png=args.png, end_to_end=ms["ours"] / 1e3)
        print(nets["ours"].fidelity(ms["ours"] / 1e3, prof))
    steps_ms = sum(r.alone_s for r in prof.rows) * 1e3
    slowest = sorted(prof.rows, key=lambda r: -r.alone_s)[:SLOWEST]
    print("slowest steps alone (us, the plan's estimate): " + ", ".join(
        f"{r.name} {r.kind} {r.alone_s * 1e6:.1f} ({r.estimate_s * 1e6:.1f})" for r in slowest))
    # a variant whose output is not finite (or does not line up) is no baseline to beat
    comparable = {k: p for k, p in precisions.items() if finite3(errors[k]) is not None}
    print(json.dumps({**run_fields(args, gpu, tuned, nets["ours"], target),
                      **timing_fields(rounds, precisions), "torch_failed": failed,
                      "errors": {k: finite3(e) for k, e in errors.items()},
                      "error_reference": yardstick, "steps_alone_ms": round(steps_ms, 3),
                      "ours_over_steps": round(ms["ours"] / steps_ms, 3),
                      "slowest_steps": [{"name": r.name, "kind": r.kind,
                                         "alone_us": round(r.alone_s * 1e6, 1),
                                         "estimate_us": round(r.estimate_s * 1e6, 1)}
                                        for r in slowest],
                      **speedups(rounds, comparable, precision)}), flush=True)


def run_fields(args, gpu: str, tuned, net, target: Target | None = None) -> dict:
    """What ran where: the JSON's keys that are not timings."""
    target = target or args.target
    return {"model": args.model, "target": str(target), "precision": target.precision,
            "record_targets": sorted({r.target for r in tuned.best.values()}),
            "device": gpu, "trials": tuned.trials, "graph": net.graph,
            "layouts": net.plan.summary(), "estimated_ms": round(net.estimated_s * 1e3, 3),
            "compile_phases_s": {k: round(v, 2) for k, v in (net.compile_phases or {}).items()},
            "quick": args.quick, "cudnn_benchmark": True,
            "compile_precisions": None if args.no_compile else list(args.compile_precisions),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda}


def timing_fields(rounds_s: dict[str, list[float]], precisions: dict[str, str]) -> dict:
    """The JSON's timings in ms: ours (and ours_uniform, and ours_plain with its per-round
    ratio to ours, where timed), each PyTorch variant with its precision, and every round
    of every one (the figures are their medians)."""
    ms = {k: round(median(v) * 1e3, 3) for k, v in rounds_s.items()}
    plain = {"ours_plain_ms": ms["ours_plain"], "plain_over_ours": spread(
        [p / o for p, o in zip(rounds_s["ours_plain"], rounds_s["ours"])])} \
        if "ours_plain" in ms else {}
    return {"ours_ms": ms["ours"], "ours_uniform_ms": ms.get("ours_uniform"), **plain,
            "torch_ms": {k: {"precision": p, "ms": ms[k]} for k, p in precisions.items()},
            "rounds_ms": {k: [round(t * 1e3, 3) for t in v] for k, v in rounds_s.items()}}


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


def precision_list(text: str) -> tuple[str, ...]:
    """--precision, --compile-precisions, --plain: comma-separated precisions among
    PRECISIONS."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [p for p in names if p not in PRECISIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give precisions among "
                                         f"{', '.join(PRECISIONS)}, comma-separated")
    return names


def tune_precision_list(text: str) -> tuple[str, ...]:
    """--tune-precisions: as --precision, or 'none'."""
    return () if text.strip() == "none" else precision_list(text)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--target", type=target_arg, default="llvm",
                    help="llvm (default: this CPU), cuda (this machine's GPU), "
                         "'cuda -arch=sm_XY' or 'cuda -precision=tf32'")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--tune-seconds", type=float, default=None,
                    help="a time budget for each tuning run as well (of each precision)")
    ap.add_argument("--threads", type=int, default=2, help="CPU only")
    ap.add_argument("--records", default=None, help="default bench/results/CPU/network_MODEL_"
                                                    "<threads>threads.jsonl (cuda: GPU/"
                                                    "network_MODEL_cuda[_PRECISION].jsonl)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-rounds", type=int, default=0,
                    help="CPU: run more rounds, up to this many, until the median of "
                    "per-round ratios against the best other variant is known within --ci")
    ap.add_argument("--ci", type=float, default=0.03,
                    help="the half-width, relative, of the ~95%% interval --max-rounds "
                    "waits for")
    ap.add_argument("--precision", type=precision_list, default=None, metavar="LIST",
                    help="cuda only: our kernels' arithmetic (default: the target's "
                         "-precision, else fp32); several, comma-separated, run in one "
                         "process (Ray started, the model loaded and PyTorch's baselines "
                         "built once), one JSON line each; PyTorch is timed in every "
                         "precision")
    ap.add_argument("--quick", action="store_true",
                    help="cuda only: a check, not a figure: short timing, no one-layout "
                         "network, no per-layer profile")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--plain", type=precision_list, default=(), metavar="LIST",
                    help="cuda only: in these precisions (comma-separated), also time the "
                         "network planned without its rewrites (compile_network(rewrites="
                         "False): no sibling kernels, permutes copied, tf32 weights converted "
                         "in the kernels), as ours_plain")
    ap.add_argument("--refine", type=int, default=8,
                    help="CPU: compile_network's refine (each step's best N records "
                         "clocked in the running network, then the split agreement); above "
                         "1, the network without both is timed too, as 'unrefined'")
    ap.add_argument("--compile-precisions", type=precision_list, default=PRECISIONS,
                    metavar="LIST", help="cuda only: torch.compile's variants in these "
                    "precisions alone (comma-separated; default all: each takes a minute "
                    "or more); eager and CUDA graphs run in every precision")
    ap.add_argument("--tune-precisions", type=tune_precision_list, default=PRECISIONS,
                    metavar="LIST", help="cuda only: tune these of --precision (default "
                    "all; 'none': none); the others compile from their records as they "
                    "are")
    ap.add_argument("--fallback", choices=["torch"], default=None,
                    help="cuda only: run PyTorch's kernel for tasks without a record")
    ap.add_argument("--png", default=None, help="save the per-layer chart here")
    args = ap.parse_args(argv)
    try:
        args.targets = [with_precision(args.target, p) for p in args.precision or (None,)]
    except ValueError as exc:
        ap.error(str(exc))  # a usage error: exit status 2
    args.target = args.targets[0]
    return args


def main() -> None:
    args = parse_args()
    if args.target.kind == "cuda":
        sys.exit(main_cuda(args))
    if args.target.mcpu:
        print(f"bench/network.py: error: --target {str(args.target)!r}: the CPU benchmark "
              "runs on this machine's own CPU; drop -mcpu", file=sys.stderr)
        sys.exit(2)
    cpu = cpu_info().name  # records measured on one CPU model are not this one's
    target, precision = str(args.target), args.target.precision
    records = args.records or cpu_records(cpu, args.model, args.threads, precision)
    os.makedirs(os.path.dirname(os.path.abspath(records)), exist_ok=True)
    model, inputs = load_model(args.model)
    x = inputs[0]

    start, since = time.perf_counter(), time.time()
    tuned = tune_network(model, inputs, trials=args.trials, seconds=args.tune_seconds,
                         records=records, threads=args.threads, target=target,
                         verbose=False)
    tune_s = time.perf_counter() - start
    import ray
    ray.shutdown()  # nothing of Ray's running while we time
    torch.set_num_threads(args.threads)
    print(f"tuned {tuned.trials} trials ({tune_s:.0f} s this run), estimated "
          f"{tuned.estimated_latency_s * 1e3:.3f} ms{measuring(records, since)}")

    from raytune_kernels.layout.costs import COUNTS

    start = time.perf_counter()
    net = compile_network(model, inputs, records, target=target, threads=args.threads,
                          verbose=True, refine=args.refine)
    compile_s = time.perf_counter() - start
    transforms = dict(COUNTS)  # timed now, or found in this machine's transform cache
    print(f"compiled and checked in {compile_s:.1f} s ({transforms['timed']} transforms "
          f"timed, {transforms['cached']} from the cache)")
    uniform = compile_network(model, inputs, records, target=target, threads=args.threads,
                              layout="uniform", verbose=True, refine=args.refine)

    fns = {"ours": lambda: net(*inputs), "uniform": lambda: uniform(*inputs)}
    if args.refine > 1:
        plain = compile_network(model, inputs, records, target=target,
                                threads=args.threads, refine=0)
        fns["unrefined"] = lambda: plain(*inputs)
    fns.update(torch_variants(model, x, not args.no_compile))
    # bf16 variants are checked as a bf16 network of ours is (report.network_bound)
    bf16_atol = network_bound(model, inputs, "bf16")[0]
    fns.update(bf16_variants(model, x, not args.no_compile, bf16_atol))
    with tempfile.TemporaryDirectory(prefix="rk_engines_") as tmp:
        engines, engine_versions, engines_missing = engine_variants(model, inputs,
                                                                    args.threads, tmp,
                                                                    bf16_atol)
    fns.update(engines)
    # each variant's arithmetic: ours the target's; PyTorch's and the engines' by name
    precisions = {k: "bf16" if k.endswith("_bf16") else DEFAULT
                  for k in fns if fns[k] is not None and k not in OURS}
    rounds: dict[str, list[float]] = {}
    ms = {k: v * 1e3 for k, v in interleaved(
        fns, args.rounds, rounds, lambda t: unsettled(best_other_ratios(t), args.ci),
        args.max_rounds).items()}
    prof = net.profile(png=args.png)
    print(net.fidelity(ms["ours"] / 1e3, prof))
    pace = machine_drift(prof.rows, threshold=0.0)
    torch_ms = {k: (round(ms[k], 3) if k in ms else None)
                for k in ("eager", "channels_last", "jit_freeze", "compile", "eager_bf16",
                          "compile_bf16")}
    best_torch = min(v for v in torch_ms.values() if v is not None)
    engines_ms = {k: round(ms[k], 3) for k in engines}
    best_any = min([best_torch, *engines_ms.values()])
    print("ours {:.3f} ms; ".format(ms["ours"]) + ", ".join(
        f"{k} {v:.3f} ms" for k, v in {**torch_ms, **engines_ms}.items() if v is not None))
    result = {"model": args.model, "cpu": cpu, "target": target, "precision": precision,
              "threads": args.threads, "trials": tuned.trials,
              "ours_ms": round(ms["ours"], 3), "uniform_ms": round(ms["uniform"], 3),
              "estimated_ms": round(net.estimated_s * 1e3, 3),
              "layout_plan_ms": round(net.plan.cost * 1e3, 3),
              "torch_ms": torch_ms, "speedup_vs_best_torch": round(best_torch / ms["ours"], 3),
              "engines_ms": engines_ms, "engine_versions": engine_versions,
              "engines_missing": engines_missing,
              # over the best of the PyTorch variants and the engines that ran here, of
              # any precision; then over those of our precision alone, and of any
              "speedup_vs_best_engine": round(best_any / ms["ours"], 3),
              "variant_precisions": precisions, **speedups(rounds, precisions, precision),
              # the ILP compile, checked; transforms timed then or found in the cache
              "compile_s": round(compile_s, 1), "compile_transforms": transforms,
              # per round: the best other variant's time over ours, and the single-layout
              # plan's over the ILP's (above 1, ours is faster), median and spread
              "speedup_vs_best_engine_rounds": spread(best_other_ratios(rounds)),
              "uniform_over_ours_rounds": spread([u / o for u, o in
                                                  zip(rounds["uniform"], rounds["ours"])]),
              # compile_network's refine: the plan's kernels against those kept after
              # clocking each step's best records in the running network, the split
              # agreement after it, and the layout weighing and NHWC reads before
              # ('unrefined' runs none)
              "refine": args.refine, "refined": refined_fields(net.refined),
              "agreed": weighing_fields(net.agreed),
              "layouts_weighed": weighing_fields(getattr(net, "weighed", None)),
              "nhwc_reads": weighing_fields(getattr(net, "nhwc_reads", None)),
              "unrefined_over_ours_rounds": spread([u / o for u, o in
                                                    zip(rounds["unrefined"], rounds["ours"])])
              if "unrefined" in rounds else None,
              # each step inside the network, alone (conv and dense weights cold, as
              # records are timed), and as the plan estimated it
              "steps_us": [{"name": r.name, "kind": r.kind, "network": round(r.ours_s * 1e6, 1),
                            "alone": round(r.alone_s * 1e6, 1),
                            "estimate": round(r.estimate_s * 1e6, 1),
                            **({"gflops": round(r.flops_per_s / 1e9, 1)}
                               if r.flops_per_s else {}),
                            **({"of_peak": round(prof.peak_share(r), 3)}
                               if prof.peak_share(r) is not None else {})}
                           for r in prof.rows],
              "peak_gflops": prof.peak_flops and round(prof.peak_flops / 1e9, 1),
              "steps_network_ms": round(sum(r.ours_s for r in prof.rows) * 1e3, 3),
              "steps_alone_ms": round(sum(r.alone_s for r in prof.rows) * 1e3, 3),
              "steps_alone_weights": "cold",
              # the recorded kernels alone here over their records, median: this machine's
              # pace against the one that tuned them (compile/report.machine_drift)
              "alone_over_records": pace and round(pace.ratio, 3),
              # every round's time of every variant (the figures above are their medians):
              # this VM's timings drift, and a figure is only as good as its spread
              "rounds_ms": {k: [round(t * 1e3, 3) for t in v] for k, v in rounds.items()}}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
