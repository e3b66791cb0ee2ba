"""bench/kernels.py and bench/network.py on a cuda target: --target parsing, and without a
GPU a one-line error and exit status 2 before any work (run here as subprocesses, as a
user would); on a machine with a GPU, each bench end to end at a small budget."""
import collections
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels import Target, zoo
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cuda import torch_timing as torch_gpu
from raytune_kernels.cuda.build import nvrtc_unavailable
from raytune_kernels.errors import CompileError

from tests.test_cli import TINY_GPU

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_GPU = torch_gpu.gpu_problem() is None
no_gpu_only = pytest.mark.skipif(HAS_GPU, reason="a CUDA GPU is visible here")
gpu_only = pytest.mark.skipif(not HAS_GPU or nvrtc_unavailable() is not None,
                              reason=f"needs a CUDA GPU and NVRTC: "
                                     f"{torch_gpu.gpu_problem() or nvrtc_unavailable()}")


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  os.path.join(ROOT, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("name, lead", [("kernels", []), ("network", ["resnet18"])])
def test_target_option_parses_cuda_with_an_arch(name, lead, capsys):
    parse = _bench(name).parse_args
    assert parse(lead).target == Target("llvm")  # the CPU benchmark stays the default
    assert parse(lead + ["--target", "cuda"]).target == Target("cuda")
    assert parse(lead + ["--target", "cuda -arch=sm_90"]).target == Target("cuda", arch="sm_90")
    with pytest.raises(SystemExit) as info:
        parse(lead + ["--target", "cuda -arch=90"])
    assert info.value.code == 2
    assert "unknown option '-arch=90' in target 'cuda -arch=90'" in capsys.readouterr().err


@no_gpu_only
@pytest.mark.parametrize("argv", [
    ["bench/kernels.py", "--target", "cuda"],
    ["bench/network.py", "resnet18", "--target", "cuda"],
    ["bench/network.py", "resnet18", "--target", "cuda -arch=sm_90"],
])
def test_without_a_gpu_a_cuda_bench_exits_2_with_one_line(argv):
    proc = _run(*argv)
    target = argv[-1]
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"{argv[0]}: error: --target {target!r} needs a CUDA GPU, and no CUDA GPU is visible "
        f"here ({torch_gpu.gpu_problem()})"]


@pytest.mark.gpu
@gpu_only
def test_kernels_bench_on_the_gpu(tmp_path):
    records = str(tmp_path / "k.jsonl")
    proc = _run("bench/kernels.py", "--target", "cuda", "--limit", "2", "--trials", "4",
                "--rounds", "1", "--records", records, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    gpu = torch_gpu.gpu_name()
    assert out["device"] == gpu and out["target"] == "cuda" and out["precision"] == "fp32"
    assert out["record_targets"] and all(t.startswith("cuda -arch=sm_")
                                         for t in out["record_targets"])
    assert len(out["tasks"]) == 2 and out["failed"] == 0
    assert all(r["ours_us"] > 0 and r["torch_us"] > 0 for r in out["tasks"])
    assert all(r["torch_layout"].endswith(" fp32") for r in out["tasks"])
    assert f"kernels on {gpu}, target 'cuda'" in proc.stderr  # the table's header
    assert "torch in fp32 with TF32 off" in proc.stderr


@pytest.mark.gpu
@gpu_only
def test_network_bench_on_the_gpu(tmp_path):
    factory = tmp_path / "tiny.py"
    factory.write_text(TINY_GPU)
    # without torch.compile's variants (a minute or more each), so that the GPU check's
    # tests fit their share; bench/network.py without --no-compile times them
    proc = _run("bench/network.py", f"{factory}:make", "--target", "cuda", "--trials", "8",
                "--rounds", "2", "--records", str(tmp_path / "n.jsonl"), "--fallback",
                "torch", "--no-compile", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["device"] == torch_gpu.gpu_name() and out["target"] == "cuda"
    assert out["precision"] == "fp32" and out["graph"] is True
    assert out["ours_ms"] > 0 and out["torch_ms"]["eager_fp32"]["ms"] > 0
    names = {v.name for v in torch_gpu.gpu_variants(use_compile=False)}
    # a baseline is timed or its failure reported, never both, never neither
    assert set(out["torch_ms"]) | set(out["torch_failed"]) == names
    assert not set(out["torch_ms"]) & set(out["torch_failed"])
    assert all(v["precision"] == k.rsplit("_", 1)[1] for k, v in out["torch_ms"].items())
    assert set(out["errors"]) == set(out["torch_ms"]) | {"ours"}
    assert out["errors"]["ours"] < 1e-3 and out["errors"]["eager_fp32"] < 1e-4
    assert out["best_same_precision"] in out["torch_ms"]
    assert out["torch_ms"][out["best_same_precision"]]["precision"] == "fp32"
    for key in ("same_precision", "any"):
        spread = out[f"speedup_vs_best_{key}_rounds"]
        assert out[f"speedup_vs_best_{key}"] > 0 and spread["min"] <= spread["median"] <= \
            spread["max"]
    assert len(out["rounds_ms"]["ours"]) == 2


def test_coverage_summary_counts_what_each_model_gave():
    coverage = _bench("coverage")
    rows = [
        {"model": "torchvision/a", "status": "ok", "islands": [], "island_count": 0,
         "correct": True, "flops_in_our_kernels": 1.0, "untuned_vs_eager": 2.0},
        {"model": "torchvision/b", "status": "ok", "islands": ["cumsum"], "island_count": 2,
         "correct": False, "flops_in_our_kernels": 0.9, "untuned_vs_eager": 1.0},
        {"model": "torchvision/c", "status": "failed", "error": "timed out after 5 s"},
        {"model": "torchvision/d", "status": "skipped", "gflops": 41.0},
    ]
    s = coverage.summary(rows, threads=1)
    assert (s["models"], s["captured"], s["compiled_and_correct"], s["no_island"]) == \
        (3, 2, 1, 1)
    assert s["islands"] == {"cumsum": ["torchvision/b"]}
    assert s["skipped"] == {"torchvision/d": 41.0}
    assert s["failed"] == {"torchvision/c": "timed out after 5 s"}
    assert s["flops_in_our_kernels"] == 0.95 and s["untuned_vs_eager"] == 1.5
    assert s["untuned_vs_onnxruntime"] is None and s["compile_s"] is None
    rows[0].update(untuned_vs_onnxruntime=0.8, compile_s=3.0)
    rows[1].update(compile_s=5.0)  # no ONNX Runtime for it: the median is of the others
    s = coverage.summary(rows, threads=1)
    assert s["untuned_vs_onnxruntime"] == 0.8 and s["compile_s"] == 4.0


def test_exercised_weights_leave_no_branch_at_a_constant_init():
    """bench/models.py's `exercised`: parameters that are one constant (a zero norm weight,
    a 1e-6 layer scale, a zero head) are drawn around it, random ones are kept, and batch
    norms get random running statistics; the output then depends on every branch."""
    models = _bench("models")
    torch.manual_seed(0)
    conv, bn, head = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Linear(8, 4)
    scale = torch.nn.Parameter(torch.full((8, 1, 1), 1e-6))
    torch.nn.init.zeros_(bn.weight)
    torch.nn.init.zeros_(head.weight)
    model = torch.nn.ModuleDict({"conv": conv, "bn": bn, "head": head})
    model.register_parameter("scale", scale)
    drawn = conv.weight.detach().clone()
    models.exercised(model)
    assert torch.equal(conv.weight, drawn)
    for p in (bn.weight, bn.bias, head.weight, head.bias, scale):
        assert p.std() > 0.03 and p.abs().max() < 1.0
    assert bn.running_mean.std() > 0.03 and 0.5 <= bn.running_var.min() <= \
        bn.running_var.max() <= 1.5


def test_gflops_counts_a_module_fed_a_parameter_view():
    """A parameter expanded under no_grad (CaiT's class token) and passed to a submodule:
    FlopCounterMode's module tracker failed on it; the count works and requires_grad is
    restored."""
    models = _bench("models")

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.token = torch.nn.Parameter(torch.randn(1, 1, 8))
            self.proj = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.proj(self.token.expand(x.shape[0], -1, -1)) + x.sum()

    model = Tokens()
    assert models.gflops(model, (torch.randn(2, 3),)) == 2 * 2 * 8 * 4 / 1e9
    assert all(p.requires_grad for p in model.parameters())


def test_timm_zoo_names_thirty_models_of_the_installed_timm():
    models = _bench("models")
    try:
        timm = models._import_optional("timm")
    except ImportError as exc:
        pytest.skip(str(exc))
    assert len(set(models.TIMM_NAMES)) == len(models.TIMM_NAMES) >= 30
    assert [n for n in models.TIMM_NAMES if not timm.is_model(n)] == []
    families = ("csp", "nfnet", "eca")
    assert all(any(f in n for n in models.TIMM_NAMES) for f in families)


def test_coverage_times_every_variant_in_each_round_and_gives_per_round_ratios():
    import time

    coverage = _bench("coverage")

    def sleeper(seconds):
        return lambda *xs: time.sleep(seconds)
    out = coverage.timed(sleeper(0.002), sleeper(0.004), (), rounds=2,
                         onnxruntime=sleeper(0.001))
    assert out["rounds"] == 2 and out["ours_ms"] < out["eager_ms"]
    low, high = out["untuned_vs_eager_range"]
    assert low <= out["untuned_vs_eager"] <= high and out["untuned_vs_eager"] > 1.2
    assert out["untuned_vs_onnxruntime"] < 0.8
    alone = coverage.timed(sleeper(0.002), sleeper(0.004), (), rounds=1)
    assert "untuned_vs_onnxruntime" not in alone and "onnxruntime_ms" not in alone


@pytest.mark.slow
def test_coverage_bench_runs_one_torchvision_model():
    models = _bench("models")
    try:
        models.import_torchvision()
    except ImportError as exc:
        pytest.skip(str(exc))
    proc = _run("bench/coverage.py", "--only", "squeezenet1_1", timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout.splitlines()[-1])
    assert s["models"] == 1 and s["compiled_and_correct"] == 1
    assert s["flops_in_our_kernels"] > 0.99


def test_network_bench_names_an_unknown_third_party_model():
    """bench/network.py takes bench/models.py's names (torchvision/NAME); an unknown one is
    one clear line, before any work."""
    network = _bench("network")
    with pytest.raises(SystemExit, match="unknown model 'torchvision/no_such_net'"):
        network.load_model("torchvision/no_such_net")


def test_the_onnx_export_takes_inputs_as_given_and_leaves_the_model_as_it_was(tmp_path):
    """A model returning a dict exports through bench/network.py's wrapper (its tensors
    flattened, as capture flattens them), and the exporter, which restores the wrapper's
    mode recursively when done, leaves the model in eval mode: its dropout off for every
    variant timed after."""
    import torch

    network = _bench("network")

    class Dict(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.drop = torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)

        def forward(self, x):
            y = self.drop(self.fc(x))
            return {"y": y, "pooled": y.mean(-1)}

    model, x = Dict().eval(), torch.randn(2, 8)
    path = str(tmp_path / "m.onnx")
    with torch.no_grad():
        torch.onnx.export(network._Flat(model), (x,), path, opset_version=17, dynamo=False)
        assert not model.training and not model.drop.training
        assert torch.equal(model(x)["y"], model(x)["y"])
        assert [t.shape for t in network._Flat(model)(x)] == [(2, 8), (2,)]


def test_the_engines_users_would_pick_instead_are_checked_then_timed(tmp_path):
    """bench/network.py's ONNX Runtime and OpenVINO baselines (the `compare` extra): the
    same model exported to ONNX, each engine's output checked against eager; without the
    packages, each is reported missing, never silently left out."""
    import torch

    network = _bench("network")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4)).eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    fns, versions, missing = network.engine_variants(model, inputs, 1, str(tmp_path))
    assert set(fns) | set(missing) == {"onnxruntime", "openvino", "openvino_bf16"}
    if "openvino_bf16" in fns:  # a CPU with bf16 arithmetic: within bf16's tolerance
        with torch.no_grad():
            want = model(*inputs)
        got = torch.from_numpy(fns["openvino_bf16"]()[0])
        assert 0 < (got - want).abs().max() <= 5e-2 * want.abs().max()
    elif "openvino" in fns:  # installed, and this CPU has no bf16: said, not left out
        assert missing["openvino_bf16"], missing
    for name in ("onnxruntime", "openvino"):
        if importlib.util.find_spec(name) is None or importlib.util.find_spec("onnx") is None:
            assert name in missing and ("not installed" in missing[name]
                                        or "No module named" in missing[name]), missing
        else:
            assert name in fns and versions[name], missing.get(name)
            out = fns[name]()[0]
            with torch.no_grad():
                assert torch.allclose(torch.from_numpy(out), model(*inputs), atol=1e-4)


def test_interleaved_rounds_rotate_and_report_every_round(monkeypatch):
    """bench/network.py's timing: each round starts one variant further along; every
    round's time of every variant is kept (the JSON's rounds_ms) and the figure is their
    median."""
    import time

    from raytune_kernels.timing import TimingOptions

    network = _bench("network")
    monkeypatch.setattr(network, "FULL", TimingOptions(warmup=0, min_repeat_ms=0, repeats=1))
    order: list[str] = []

    def fn(name: str, seconds: float):
        def run():
            order.append(name)
            time.sleep(seconds)
        return run
    per_round: dict = {}
    got = network.interleaved({"a": fn("a", 0.002), "b": fn("b", 0.004), "c": None}, 3,
                              per_round)
    assert len(order) == 12  # each variant: one call to size the repeat, one repeat
    assert order[::2] == ["a", "b", "b", "a", "a", "b"]  # rounds: a b | b a | a b
    assert set(per_round) == {"a", "b"} and all(len(v) == 3 for v in per_round.values())
    for k in ("a", "b"):
        assert got[k] == sorted(per_round[k])[1]
    assert got["a"] < got["b"]


def test_the_median_ratio_gets_an_interval_and_rounds_go_on_until_it_is_narrow(monkeypatch):
    """bench/network.py --max-rounds: the interval of the median of per-round ratios is
    the order statistics around it (none under 6 rounds); rounds are added until it is
    narrower than --ci, and stop at --max-rounds when it never is."""
    from raytune_kernels.timing import TimingOptions

    network = _bench("network")
    assert network.median_ci([1.0] * 5) is None
    ratios = [1.0 + 0.01 * i for i in range(25)]  # median 1.12
    lo, hi = network.median_ci(ratios)
    assert lo < 1.12 < hi and (lo, hi) == (ratios[7], ratios[17])
    assert network.spread(ratios)["ci95"] == [1.07, 1.17]
    assert network.unsettled(ratios, 0.03) and not network.unsettled(ratios, 0.05)
    assert "ci95" not in network.spread(ratios[:5])

    monkeypatch.setattr(network, "FULL", TimingOptions(warmup=0, min_repeat_ms=0, repeats=1))
    monkeypatch.setattr(network, "time_fn", lambda fn, opts: [fn()])
    noisy = iter([1.0, 1.3, 0.8, 1.25, 0.7] * 40)
    fns = {"ours": lambda: 1.0, "other": lambda: next(noisy)}

    def settle(half):
        per: dict = {}
        network.interleaved(fns, 3, per, lambda t: network.unsettled(
            [o / u for o, u in zip(t["other"], t["ours"])], half), 40)
        return len(per["ours"])
    assert settle(10.0) == 6  # settled as soon as an interval exists
    assert settle(0.001) == 40  # never settles: stops at the cap


def test_our_own_variants_are_never_the_best_other_and_refine_is_reported():
    """bench/network.py: the uniform and unrefined networks are ours, not a baseline the
    ratio is taken against; the refine report goes to the JSON as plain numbers."""
    from raytune_kernels.compile.refine import Refined

    network = _bench("network")
    rounds = {"ours": [1.0, 2.0], "uniform": [0.5, 0.5], "unrefined": [0.4, 0.4],
              "onnxruntime": [1.5, 3.0]}
    assert network.best_other_ratios(rounds) == [1.5, 1.5]
    assert network.refined_fields(None) is None
    got = network.refined_fields(Refined(variants=8, steps=5, changed=["a", "b"],
                                         before_s=3e-3, after_s=2.5e-3, seconds=4.04,
                                         speedup=1.0512))
    assert got == {"variants": 8, "steps": 5, "changed": 2, "seconds": 4.0,
                   "clocked_before_ms": 3.0, "clocked_after_ms": 2.5, "end_to_end": 1.051,
                   "recalled": False}


# ------------------------------------------------ GPU baselines: the pure parts, on the CPU

@pytest.mark.parametrize("name, lead", [("kernels", []), ("network", ["resnet18"])])
def test_precision_comes_from_the_flag_or_the_target_string(name, lead, capsys):
    parse = _bench(name).parse_args
    tf32 = Target("cuda", precision="tf32")
    assert parse(lead + ["--target", "cuda", "--precision", "tf32"]).target == tf32
    assert parse(lead + ["--target", "cuda -precision=tf32"]).target == tf32
    assert parse(lead + ["--target", "cuda -precision=tf32", "--precision", "tf32"]).target \
        == tf32
    assert parse(lead + ["--target", "cuda -arch=sm_90", "--precision", "bf16"]).target == \
        Target("cuda", arch="sm_90", precision="bf16")
    assert parse(lead + ["--target", "cuda"]).target.precision == "fp32"
    for argv, why in ((["--target", "cuda -precision=tf32", "--precision", "fp16"],
                       "--precision fp16 contradicts the target's -precision=tf32"),
                      (["--precision", "fp16"], "--precision fp16: a cuda option"),
                      (["--target", "cuda", "--precision", "int8"],
                       "invalid choice: 'int8'" if name == "kernels" else
                       "'int8': give precisions among fp32, tf32, fp16, bf16")):
        with pytest.raises(SystemExit) as info:
            parse(lead + argv)
        assert info.value.code == 2 and why in capsys.readouterr().err


def test_records_default_per_gpu_with_the_precision_in_the_name():
    network = _bench("network")
    folder = os.path.join(ROOT, "bench", "results", "h100-80gb-hbm3")
    gpu = "NVIDIA H100 80GB HBM3"
    # fp32 keeps the name it had before precisions, as target strings leave fp32 out
    assert network.default_records(gpu, "resnet18", "fp32") == \
        os.path.join(folder, "network_resnet18_cuda.jsonl")
    assert network.default_records(gpu, "hf/BertModel", "bf16") == \
        os.path.join(folder, "network_hf_BertModel_cuda_bf16.jsonl")


def test_a_precision_left_untuned_compiles_from_its_records_as_they_are(tmp_path,
                                                                       monkeypatch):
    """bench/network.py --tune-precisions: the others take their records (of their own
    precision only) without Ray; none at all is a network of untuned defaults."""
    network = _bench("network")
    args = network.parse_args(["resnet18", "--target", "cuda", "--precision",
                               "tf32,fp16,fp32", "--tune-precisions", "tf32"])
    assert args.tune_precisions == ("tf32",)
    assert network.parse_args(["resnet18", "--target", "cuda", "--tune-precisions",
                               "none"]).tune_precisions == ()
    h100 = os.path.join(ROOT, "bench", "results", "h100-80gb-hbm3")
    mixed = tmp_path / "mixed.jsonl"
    with open(mixed, "w") as f:
        for name in ("network_resnet18_cuda_fp16.jsonl", "network_resnet18_cuda.jsonl"):
            f.write(open(os.path.join(h100, name)).read())
    fp16 = Target("cuda", precision="fp16")
    def no_tuning(*a, **k):
        raise AssertionError("a precision left untuned was tuned")
    monkeypatch.setattr(network, "tune_network", no_tuning)
    got = network.tune_gpu(args, None, None, fp16, str(mixed), "a GPU")
    fp16_lines = sum(1 for _ in open(os.path.join(h100, "network_resnet18_cuda_fp16.jsonl")))
    assert got.trials == fp16_lines and got.records == str(mixed)
    assert {r.target for r in got.best.values()} == {"cuda -arch=sm_90 -precision=fp16"}
    assert len(got.best) == 21 and math.isnan(got.estimated_latency_s)
    none = network.tune_gpu(args, None, None, Target("cuda", precision="fp32"),
                            str(tmp_path / "absent.jsonl"), "a GPU")
    assert none.trials == 0 and none.best == {}


def test_every_baseline_how_in_every_precision():
    variants = torch_gpu.gpu_variants()
    assert [v.name for v in variants[:4]] == ["eager_fp32", "eager_tf32", "eager_fp16",
                                              "eager_bf16"]
    assert {v.how for v in variants} == {"eager", "graph", "compile", "compile_ro"}
    assert len({v.name for v in variants}) == 16
    assert {v.how for v in torch_gpu.gpu_variants(use_compile=False)} == {"eager", "graph"}
    assert [v.precision for v in variants if v.channels_last] == ["fp16", "bf16"] * 4
    # torch.compile in some precisions alone (the slow variants); eager and graphs in all
    some = torch_gpu.gpu_variants(compile_precisions=("tf32",))
    assert [v.name for v in some[8:]] == ["compile_tf32", "compile_ro_tf32"]
    assert some[:8] == variants[:8]


def test_compile_precisions_parse_and_refuse_what_is_not_one(capsys):
    network = _bench("network")
    args = network.parse_args(["resnet18", "--target", "cuda", "--compile-precisions",
                               "tf32, fp16"])
    assert args.compile_precisions == ("tf32", "fp16")
    assert network.parse_args(["resnet18"]).compile_precisions == network.PRECISIONS
    with pytest.raises(SystemExit) as exc:
        network.parse_args(["resnet18", "--compile-precisions", "tf32,fp64"])
    assert exc.value.code == 2 and "give precisions among fp32, tf32, fp16, bf16" in \
        capsys.readouterr().err


# made-up per-round seconds: ours and five PyTorch variants in three precisions
ROUNDS = {"ours": [1.0, 1.1, 0.9], "eager_fp32": [2.0, 2.0, 2.0],
          "compile_fp32": [1.5, 1.8, 1.2], "graph_tf32": [0.8, 0.9, 0.7],
          "eager_fp16": [0.5, 0.6, 0.4], "broken_fp16": [0.1, 0.1, 0.1]}
PRECISIONS = {"eager_fp32": "fp32", "compile_fp32": "fp32", "graph_tf32": "tf32",
              "eager_fp16": "fp16"}  # broken_fp16 left out: its output was not finite


def test_variants_grouped_by_precision_and_the_fastest_picked():
    network = _bench("network")
    assert network.by_precision(PRECISIONS) == {"fp32": ["eager_fp32", "compile_fp32"],
                                                "tf32": ["graph_tf32"], "fp16": ["eager_fp16"]}
    ms = {"a": 2.0, "b": 1.0, "c": float("nan")}
    assert network.fastest(ms, ["a", "b", "c"]) == "b"
    assert network.fastest(ms, ["a", "c", "missing"]) == "a"
    assert network.fastest(ms, ["c"]) is None and network.fastest(ms, []) is None


def test_speedups_against_the_best_of_our_precision_and_of_any():
    """Ratios of medians, and the median and spread of per-round ratios (their round r
    over our round r); a variant missing from the precisions never counts."""
    got = _bench("network").speedups(ROUNDS, PRECISIONS, "fp32")
    assert got["best_same_precision"] == "compile_fp32"
    assert got["speedup_vs_best_same_precision"] == 1.5  # 1.5 / 1.0
    assert got["speedup_vs_best_same_precision_rounds"] == \
        {"median": 1.5, "min": 1.333, "max": 1.636}  # 1.5/1.0, 1.8/1.1, 1.2/0.9
    assert got["best_any"] == "eager_fp16" and got["speedup_vs_best_any"] == 0.5
    assert got["speedup_vs_best_any_rounds"] == {"median": 0.5, "min": 0.444, "max": 0.545}


@pytest.mark.parametrize("precision, best, speedup", [("tf32", "graph_tf32", 0.8),
                                                      ("fp16", "eager_fp16", 0.5),
                                                      ("bf16", None, None)])
def test_each_precision_meets_its_own_variants(precision, best, speedup):
    got = _bench("network").speedups(ROUNDS, PRECISIONS, precision)
    assert got["best_same_precision"] == best
    assert got["speedup_vs_best_same_precision"] == speedup
    assert (got["speedup_vs_best_same_precision_rounds"] is None) == (best is None)
    assert got["best_any"] == "eager_fp16"


def test_timing_fields_give_each_variant_its_precision_and_every_round():
    got = _bench("network").timing_fields(ROUNDS, PRECISIONS)
    assert got["ours_ms"] == 1000.0 and got["ours_uniform_ms"] is None
    assert got["torch_ms"] == {"eager_fp32": {"precision": "fp32", "ms": 2000.0},
                               "compile_fp32": {"precision": "fp32", "ms": 1500.0},
                               "graph_tf32": {"precision": "tf32", "ms": 800.0},
                               "eager_fp16": {"precision": "fp16", "ms": 500.0}}
    assert got["rounds_ms"]["compile_fp32"] == [1500.0, 1800.0, 1200.0]
    assert set(got["rounds_ms"]) == set(ROUNDS)
    assert "ours_plain_ms" not in got and "plain_over_ours" not in got


def test_the_plan_without_its_rewrites_is_reported_beside_ours():
    rounds = {**ROUNDS, "ours_plain": [1.2, 1.65, 0.9]}
    got = _bench("network").timing_fields(rounds, PRECISIONS)
    assert got["ours_plain_ms"] == 1200.0
    # the median of the per-round ratios (over ours' rounds 1.0, 1.1, 0.9), and its spread
    assert got["plain_over_ours"] == {"median": 1.2, "min": 1.0, "max": 1.5}


def test_gpu_timing_is_interleaved_round_by_round():
    network = _bench("network")
    order: list[str] = []

    def timer(name: str, seconds: float):
        return lambda: order.append(name) or seconds
    got = network.interleaved_gpu({"ours": timer("ours", 1.0), "a": timer("a", 2.0),
                                   "b": timer("b", 3.0)}, 3)
    assert order == ["ours", "a", "b", "a", "b", "ours", "b", "ours", "a"]
    assert got == {"ours": [1.0] * 3, "a": [2.0] * 3, "b": [3.0] * 3}


def test_precision_mode_turns_tf32_on_only_for_tf32_then_restores():
    b = torch.backends
    old = b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark
    for precision, tf32 in (("tf32", True), ("fp32", False), ("fp16", False)):
        with torch_gpu.precision_mode(precision):
            assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == \
                (tf32, tf32, True)
        assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == old
    with pytest.raises(KeyError), torch_gpu.precision_mode("tf32"):
        raise KeyError  # restored on the way out of an error too
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == old


def test_half_precision_copies_cast_the_model_and_images_not_token_ids():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    x, ids = torch.randn(1, 3, 8, 8), torch.arange(6).reshape(1, 6)
    moved, (mx, mids) = torch_gpu.on_gpu(model, (x, ids), channels_last=True, device="cpu",
                                         dtype=torch.float16)
    assert {p.dtype for p in moved.parameters()} == {torch.float16}
    assert moved[1].running_mean.dtype == torch.float16
    assert mx.dtype == torch.float16 and mx.is_contiguous(memory_format=torch.channels_last)
    assert mids.dtype == torch.int64 and torch.equal(mids, ids)
    assert next(model.parameters()).dtype == torch.float32  # the caller's model untouched


def test_baselines_are_built_alone_checked_against_fp64_and_failures_reported(capsys):
    """build_variants on the CPU: eager in fp32 and bf16 build and are checked against
    the fp64 reference at once; a CUDA graph cannot be captured here, so it is reported
    and left out while the others stay."""
    network = _bench("network")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4)).eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    want, yardstick = network.reference_output(model, inputs)
    assert want.dtype == torch.float64 and yardstick == "fp64 eager on the CPU"
    variants = [torch_gpu.GpuVariant("eager", "fp32"), torch_gpu.GpuVariant("eager", "bf16"),
                torch_gpu.GpuVariant("graph", "fp32")]
    fns, failed, errors = torch_gpu.build_variants(
        model, inputs, variants, lambda out: network.output_error_of(out, want), device="cpu")
    assert set(fns) == {"eager_fp32", "eager_bf16"} and set(failed) == {"graph_fp32"}
    assert f"PyTorch graph_fp32 failed: {failed['graph_fp32']}" in capsys.readouterr().err
    assert set(errors) == set(fns)
    assert errors["eager_fp32"] < 1e-5 < errors["eager_bf16"] < 5e-2
    assert fns["eager_bf16"]().dtype == torch.bfloat16


def test_output_errors_line_up_tuples_and_refuse_mismatches():
    network = _bench("network")
    want = (torch.ones(2, dtype=torch.float64), torch.full((3,), 2.0, dtype=torch.float64))
    got = (torch.ones(2, dtype=torch.float16), torch.full((3,), 2.5))
    assert network.output_error_of(got, want) == 0.25  # 0.5 of a scale of 2
    assert math.isnan(network.output_error_of(got[:1], want))
    assert network.finite3(math.nan) is None and network.finite3(0.123456) == 0.123


def test_kernel_baseline_runs_in_the_precision_asked():
    kernels = _bench("kernels")
    model, inputs = zoo.load("resnet18")
    task = next(t for t in rk.extract_tasks(model, inputs) if t.compute.op == "conv2d")
    fns = kernels.torch_gpu_fns(task.compute, 0, "bf16", device="cpu")
    assert list(fns) == ["NCHW bf16", "channels_last bf16"]
    assert all(fn().dtype == torch.bfloat16 for fn in fns.values())
    assert all(fn().dtype == torch.float32 for fn in
               kernels.torch_gpu_fns(task.compute, 0, "tf32", device="cpu").values())


# --------------------------------------------------------------- bench/gpu_check.sh

GPU_CHECK = os.path.join(ROOT, "bench", "gpu_check.sh")
CHECK_TESTS = ["tests/cuda", "tests/compile/test_cuda_network.py",
               "tests/actors/test_tune_cuda.py", "tests/test_bench.py", "tests/test_cli.py"]
CHECK_MODELS = ["resnet18", "mobilenet_v2", "hf/BertModel"]
CHECK_PRECISIONS = "tf32,fp16,bf16,fp32"  # each model's run compiles every one


def _check(*argv: str, env: dict | None = None, script: str = GPU_CHECK):
    return subprocess.run(["bash", script, *argv], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def _steps(stdout: str) -> list[list[str]]:
    return [line.split()[1:] for line in stdout.splitlines() if line.startswith("$ ")]


def test_gpu_check_dry_run_plans_every_step_within_8_minutes(tmp_path):
    proc = _check("--dry-run", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    steps = _steps(proc.stdout)
    assert all(s[:2] == ["timeout", "-k"] for s in steps)
    # the tests that need a GPU, one line each (the dry run prints -m's words apart)
    assert " ".join(steps[0][4:]) == "env RK_FAILURES_AT_ONCE=1 python -m pytest -v -m gpu " \
        "and not slow -rfE " \
        "--durations=10 --deselect=tests/test_bench.py::test_network_bench_on_the_gpu " \
        "--deselect=tests/test_bench.py::test_kernels_bench_on_the_gpu " + \
        " ".join(CHECK_TESTS)
    assert all(os.path.exists(os.path.join(ROOT, p)) for p in CHECK_TESTS)
    # one process a model, every precision in it, sharing the time by weight
    runs = [(s[6], s[s.index("--precision") + 1]) for s in steps[1:]]
    assert runs == [(m, CHECK_PRECISIONS) for m in CHECK_MODELS]
    assert all(s[4:6] == ["python", "bench/network.py"] and "--quick" in s
               for s in steps[1:])
    # BERT-base times its tf32 plan against the plan without its rewrites too
    assert [s[s.index("--plain") + 1] if "--plain" in s else None for s in steps[1:]] == \
        [None, None, "tf32"]
    # tuning bounded by time, tf32's alone in these shares: the run keeps its compiles,
    # timing and the tuning's own fixed cost
    for s in steps[1:]:
        assert s[s.index("--tune-precisions") + 1] == "tf32"
        tune = int(s[s.index("--tune-seconds") + 1])
        assert 10 <= tune <= int(s[3]) - 25 - 4 * 12 - 25 - 5 * ("--plain" in s)
    # each step's limit plus the grace of its kill, all together, within 480 s
    assert sum(int(s[2]) + int(s[3]) for s in steps) <= 480
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_a_gpu_check_short_of_time_tunes_nothing_and_still_times_every_precision(tmp_path):
    script = tmp_path / "gpu_check.sh"
    script.write_text(open(GPU_CHECK).read().replace("\nTOTAL_S=480\n", "\nTOTAL_S=300\n"))
    proc = _check("--dry-run", script=str(script))
    steps = _steps(proc.stdout)
    assert proc.returncode == 0 and len(steps) == 4, proc.stderr
    for s in steps[1:]:
        assert s[s.index("--tune-precisions") + 1] == "none" and "--tune-seconds" not in s
        assert s[s.index("--precision") + 1] == CHECK_PRECISIONS


def test_the_gpu_check_sees_a_failure_as_it_happens(tmp_path):
    """With RK_FAILURES_AT_ONCE (the GPU check's tests) a failing test's report is printed
    when it fails, before the next test runs, so a time limit that kills pytest later
    leaves the reason in the log."""
    (tmp_path / "test_two.py").write_text(
        "def test_a():\n    assert 1 + 1 == 3, 'arithmetic broke'\n\n"
        "def test_b():\n    print('second test ran')\n")
    argv = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-s",
            "-p", "no:cacheprovider", str(tmp_path / "test_two.py")]
    for env, at_once in (({"RK_FAILURES_AT_ONCE": "1"}, True), ({}, False)):
        env = {k: v for k, v in os.environ.items() if k != "RK_FAILURES_AT_ONCE"} | env
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env=env)
        out = proc.stdout
        assert proc.returncode == 1 and "second test ran" in out
        assert ("arithmetic broke" in out.split("second test ran")[0]) == at_once


def test_gpu_check_writes_to_OUT_by_default():
    proc = _check("--dry-run", env={"OUT": "/somewhere/out"})
    assert proc.stdout.splitlines()[0] == \
        "GPU: <gpu>; results in /somewhere/out (records: bench/results/<gpu>)"


FAKE_PYTHON = """#!/usr/bin/env bash
case "$1" in
  -) if [ $# -gt 1 ]; then exec python3 "$@"; fi  # the script's own helpers run for real
     cat > /dev/null; printf 'NVIDIA Fake GPU\\tfake-gpu\\n' ;;
  -c) exit 0 ;;
  -m) echo "3 passed in 0.1s" ;;
  bench/network.py)
    case "$2" in
      resnet18) for p in ${6//,/ }; do  # no line for bf16
                  [ "$p" = bf16 ] && continue
                  echo '{}' > "bench/results/fake-gpu/network_resnet18_cuda_$p.jsonl"
                  echo "tuned"; echo "{\\"model\\": \\"resnet18\\", \\"precision\\": \\"$p\\"}"
                done ;;
      mobilenet_v2) echo "boom in $6" >&2; exit 1 ;;
      *) exit 124 ;;
    esac ;;
esac
"""


def test_gpu_check_goes_on_past_failures_and_keeps_to_three_files(tmp_path):
    """The script's own logic with a fake python and nvidia-smi: one JSON line per model
    and precision (a run's own, or its failure), everything in one log, the records the
    runs wrote packed, nothing else in the output folder."""
    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    for p in CHECK_TESTS:
        (repo / p).parent.mkdir(parents=True, exist_ok=True)
        (repo / p).touch()
    (repo / "bench").mkdir()
    (repo / "bench" / "gpu_check.sh").write_text(open(GPU_CHECK).read())
    bin_.mkdir()
    (bin_ / "python").write_text(FAKE_PYTHON)
    (bin_ / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA Fake GPU'\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    # ResNet-18's records so far: 3 in tf32, 1 in fp16, 2 in fp32, none in bf16
    had = repo / "bench" / "results" / "fake-gpu"
    had.mkdir(parents=True)
    for name, n in (("_tf32", 3), ("_fp16", 1), ("", 2)):
        (had / f"network_resnet18_cuda{name}.jsonl").write_text("{}\n" * n)
    out = tmp_path / "out"
    proc = _check(str(out), env={"PATH": f"{bin_}:{os.environ['PATH']}"},
                  script=str(repo / "bench" / "gpu_check.sh"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["gpu_check.jsonl", "gpu_check.log", "records.tar.gz"]
    lines = [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()]
    assert [(x["model"], x["precision"]) for x in lines] == \
        [(m, p) for m in CHECK_MODELS for p in CHECK_PRECISIONS.split(",")]
    by_model = {m: [x for x in lines if x["model"] == m]
                for m in ("resnet18", "mobilenet_v2", "hf/BertModel")}
    assert [x.get("error") for x in by_model["resnet18"]] == [None, None, "no JSON line", None]
    assert all(x["error"] == "exit status 1" for x in by_model["mobilenet_v2"])
    assert all(x["error"].startswith("timed out after ") for x in by_model["hf/BertModel"])
    log = (out / "gpu_check.log").read_text()
    assert "3 passed" in log and f"boom in {CHECK_PRECISIONS}" in log and \
        "GPU: NVIDIA Fake GPU" in log
    # the tests ending at once leave the runs time to tune: the least tuned precisions
    # first, as many as get 10 s each (ResNet-18 two, the others, then alone, all four)
    assert [s[s.index("--tune-precisions") + 1] for s in _steps(log)[1:]] == \
        ["bf16,fp16", CHECK_PRECISIONS, CHECK_PRECISIONS]
    import tarfile
    with tarfile.open(out / "records.tar.gz") as tar:
        assert sorted(os.path.basename(n) for n in tar.getnames()) == sorted(
            f"network_resnet18_cuda_{p}.jsonl" for p in ("tf32", "fp16", "fp32"))


@no_gpu_only
def test_gpu_check_without_a_gpu_says_so_and_writes_nothing(tmp_path):
    proc = _check(str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith("bench/gpu_check.sh: no GPU to check")
    assert torch_gpu.gpu_problem() in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("precision", ["bf16", "tf32,bf16"])
def test_cuda_bench_wiring_with_fakes_on_the_cpu(tmp_path, monkeypatch, capsys, precision):
    """bench_cuda end to end with the GPU parts faked: tuning and compiling (a fake network
    that runs the model), the baselines built on the CPU (CUDA graphs fail here and are
    reported), and a clock that gives each precision its own time. The JSON holds every
    key the issue asks for, computed from those times. Several precisions in one run:
    each tuned and compiled, the baselines built once, one JSON line each."""
    network = _bench("network")
    factory = tmp_path / "tiny.py"
    factory.write_text("import torch\n\ndef make():\n    torch.manual_seed(0)\n"
                       "    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())\n"
                       "    return m.eval(), (torch.randn(1, 3, 8, 8),)\n")

    class FakeNet:
        graph, estimated_s = True, 1e-3
        compile_phases = {"capture": 0.25, "build": 2.0}
        plan = type("Plan", (), {"summary": lambda self: "2 steps"})()

        def __init__(self, model):
            self.model = model

        def __call__(self, *xs):
            return self.model(*xs)

        def benchmark(self, opts):
            return 1.2e-3

        def profile(self, **kw):  # two steps, 0.4 and 0.6 ms each alone
            from raytune_kernels.compile.report import Profile, ProfileRow
            assert kw["end_to_end"] == 1.2e-3 and not kw["with_torch"]
            return Profile([ProfileRow(n, "kernel", (), t, t, None, t)
                            for n, t in (("a", 4e-4), ("b", 6e-4))], kw["end_to_end"])

    tuned = type("Tuned", (), {"trials": 8, "estimated_latency_s": 1e-3, "best": {}})()
    calls = collections.Counter()
    monkeypatch.setattr(network, "tune_network", lambda *a, target, seconds, **k: calls.update(
        ["tune " + target, f"for {seconds} s"]) or tuned)
    def compile_network(model, *a, target, **k):  # of several precisions, tf32's fails
        if "tf32" in target:
            raise CompileError("no kernel for this in tf32")
        return FakeNet(model)
    monkeypatch.setattr(network, "compile_network", compile_network)
    real_build = torch_gpu.build_variants
    monkeypatch.setattr(torch_gpu, "build_variants", lambda *a, **k: calls.update(
        ["baselines"]) or real_build(*a, **k, device="cpu"))
    clock = {"fp32": 3e-3, "tf32": 2e-3, "fp16": 1e-3, "bf16": 1.5e-3}
    monkeypatch.setattr(torch_gpu, "time_torch_gpu",
                        lambda fn, opts, precision: [clock[precision]])
    args = network.parse_args([f"{factory}:make", "--target", "cuda", "--precision",
                               precision, "--quick", "--no-compile", "--records",
                               str(tmp_path / "r.jsonl"), "--tune-seconds", "30"])
    assert network.bench_cuda(args, "NVIDIA Fake GPU") == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]
    assert [x["precision"] for x in lines] == precision.split(",")
    assert calls == {"baselines": 1, "for 30.0 s": len(precision.split(",")),
                     **{f"tune cuda -precision={p}": 1 for p in precision.split(",")}}
    assert [x["error"] for x in lines[:-1]] == \
        ["CompileError: no kernel for this in tf32"] * (len(lines) - 1)  # the others go on
    out = lines[-1]
    assert (out["target"], out["precision"], out["device"]) == \
        ("cuda -precision=bf16", "bf16", "NVIDIA Fake GPU")
    assert set(out["torch_failed"]) == {f"graph_{p}" for p in clock}  # no CUDA graphs here
    assert out["torch_ms"] == {f"eager_{p}": {"precision": p, "ms": t * 1e3}
                               for p, t in clock.items()}
    assert out["ours_ms"] == 1.2 and out["ours_uniform_ms"] is None
    assert out["best_same_precision"] == "eager_bf16"
    assert out["speedup_vs_best_same_precision"] == 1.25
    assert out["best_any"] == "eager_fp16" and out["speedup_vs_best_any"] == 0.833
    assert out["speedup_vs_best_any_rounds"] == {"median": 0.833, "min": 0.833, "max": 0.833}
    assert out["errors"]["ours"] < 1e-6
    assert out["errors"]["eager_fp32"] < 1e-5 < out["errors"]["eager_bf16"] < 5e-2
    assert out["error_reference"] == "fp64 eager on the CPU" and out["quick"] is True
    assert len(out["rounds_ms"]["ours"]) == 3
    assert out["steps_alone_ms"] == 1.0 and out["ours_over_steps"] == 1.2
    assert out["compile_phases_s"] == {"capture": 0.25, "build": 2.0}
    assert [(x["name"], x["alone_us"]) for x in out["slowest_steps"]] == [("b", 600.0),
                                                                         ("a", 400.0)]


def test_search_benches_refuse_bad_strategies_and_a_history_without_records(tmp_path):
    for script, lead in (("bench/search.py", []), ("bench/search_network.py", ["resnet18"])):
        proc = _run(script, *lead, "--strategies", "model,nope")
        assert proc.returncode != 0 and "unknown strategies ['nope']" in proc.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = _run("bench/search.py", "--history", str(empty), "--cold", "--threads", "2")
    assert proc.returncode != 0
    assert "holds no llvm records at 2 threads with --cold" in proc.stderr


def test_bf16_variants_run_where_the_cpu_computes_in_bf16():
    """bench/network.py's PyTorch bf16 baselines: built on a CPU with bf16 arithmetic
    (float32 outputs within bf16's tolerance), left out with a reason elsewhere."""
    import torch

    network = _bench("network")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    fns = network.bf16_variants(model, x, use_compile=False)
    assert set(fns) == {"eager_bf16", "compile_bf16"} and fns["compile_bf16"] is None
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert fns["eager_bf16"] is None
        return
    with torch.no_grad():
        want, got = model(x), fns["eager_bf16"]()
    assert got.dtype == torch.float32
    assert 0 < (got - want).abs().max() <= 5e-2 * want.abs().max()


def test_cpu_records_default_per_precision():
    network = _bench("network")
    assert network.cpu_records("znver5", "resnet18", 2).endswith(
        "/znver5/network_resnet18_2threads.jsonl")
    assert network.cpu_records("znver5", "hf/BertModel", 2, "bf16").endswith(
        "/znver5/network_hf_BertModel_2threads_bf16.jsonl")


def test_the_tuning_line_tells_what_measuring_this_runs_candidates_took(tmp_path):
    """bench/network.py's `measuring`: the records written since the run began (their
    count, median run_s and build_s), none of the older ones; nothing for no new record."""
    from raytune_kernels.tune.records import Record, RecordWriter

    measuring = _bench("network").measuring
    path = str(tmp_path / "r.jsonl")
    old = [Record("k", "cuda", "gpu", {"x": i}, (1e-5,), None, "", 9.0, 9.0, 100.0)
           for i in range(3)]
    new = [Record("k", "cuda", "gpu", {"x": i}, (1e-5,), None, "", 0.2, run, 200.0)
           for i, run in enumerate((0.05, 0.07, 0.2))]
    with RecordWriter(path) as w:
        w.write_batch(old + new)
    assert measuring(path, 150.0) == ", 3 measured, median 70 ms each (build 200 ms)"
    assert measuring(path, 300.0) == ""


def test_the_prefetch_bench_leaves_out_what_prefetches_and_names_missing_records(tmp_path):
    from types import SimpleNamespace

    prefetch = _bench("prefetch")
    records = [SimpleNamespace(ok=True, config={"ob": 16}),
               SimpleNamespace(ok=True, config={"ob": 16, "prefetch_b": 0}),
               SimpleNamespace(ok=True, config={"ob": 16, "prefetch_b": 1024}),
               SimpleNamespace(ok=False, config={"ob": 32, "prefetch_b": 1024})]
    assert prefetch.without_prefetch(records) == [records[0], records[1], records[3]]
    missing = str(tmp_path / "none.jsonl")
    done = _run("bench/prefetch.py", "resnet18", "--records", missing)
    assert done.returncode != 0 and f"no records at {missing}" in done.stderr


def test_the_transforms_bench_names_missing_records_and_wants_threads(tmp_path):
    missing = str(tmp_path / "none.jsonl")
    done = _run("bench/transforms.py", "resnet18", "--records", missing)
    assert done.returncode != 0 and f"no records at {missing}" in done.stderr
    done = _run("bench/transforms.py", "resnet18", "--threads", "1")
    assert done.returncode != 0 and "at 1 thread no transform runs in parallel" in done.stderr


def _small_cnn(tmp_path):
    """A file defining make(): a small CNN and its input, as the benches take a model
    (path/to/file.py:make)."""
    model_file = tmp_path / "cnn.py"
    model_file.write_text(
        "import torch\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),\n"
        "                            torch.nn.Conv2d(16, 16, 1)).eval()\n"
        "    return m, (torch.randn(1, 3, 16, 16),)\n")
    return model_file


def test_boundary_bench_times_a_handed_input_against_a_copied_one(tmp_path):
    """bench/boundary.py on a small untuned CNN: both ways timed every round, the input
    handed to the kernels, the time outside the native run reported for each."""
    model_file = _small_cnn(tmp_path)
    proc = _run("bench/boundary.py", f"{model_file}:make", "--threads", "1", "--rounds", "6",
                "--records", "none", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    (r,) = out["models"].values()
    assert out["bench"] == "boundary" and r["inputs_handed"] == r["inputs"] == 1
    assert r["input_bytes"] == 3 * 16 * 16 * 4 and r["copied_over_handed"]["rounds"] == 6
    assert r["handed_ms"] > 0 and r["copied_ms"] > 0
    assert 0 < r["handed_outside_us"] < r["handed_ms"] * 1e3


def test_agree_bench_refuses_one_thread_and_one_records_file_for_two_models():
    """bench/agree.py weighs how threads split rows: at one thread there is nothing to
    compare; one --records file cannot serve two models. Both one line, before any work."""
    one = _run("bench/agree.py", "resnet18", "--threads", "1")
    assert one.returncode != 0 and "one thread splits nothing" in one.stderr
    two = _run("bench/agree.py", "resnet18", "mobilenet_v2", "--records", "r.jsonl")
    assert two.returncode != 0 and "--records names one model's records" in two.stderr


def test_layers_bench_names_each_engine_node_by_the_module_it_came_from():
    """bench/layers.py reads the exporter's scopes: a child of a Sequential is named from
    its Sequential's parent (conv.0.0 under features.1.conv), a block's children from the
    block; op names, numbers and layout reorders name no module."""
    layers = _bench("layers")
    modules = {"layer2", "layer2.0", "layer2.0.conv1", "layer2.0.downsample",
               "layer2.0.downsample.0", "features", "features.1", "features.1.conv",
               "features.1.conv.0", "features.1.conv.0.0", "fc"}
    of = functools.partial(layers.module_of, modules=modules)
    assert of("/model/layer2/layer2.0/conv1/Conv/WithoutBiases") == "layer2.0.conv1"
    assert of("/model/layer2/layer2.0/downsample/downsample.0/Conv_output_0_nchwc") == \
        "layer2.0.downsample.0"
    assert of("/model/features/features.1/conv/conv.0/conv.0.0/Conv") == "features.1.conv.0.0"
    assert of("/model/layer2/layer2.0/relu/Relu_output_0_nchwc") == "layer2.0"
    assert of("/model/fc/Gemm") == "fc"
    assert of("191") is None and of("ReorderOutput") is None and of("/model/Flatten") is None


def test_layers_bench_attaches_fused_and_unnamed_nodes_to_our_steps():
    """A node of a step's layer goes to it; a conv named after its fused activation to the
    next kernel step no node claimed; an add or reorder to the node before it; a node
    before any step is unattributed."""
    layers = _bench("layers")
    steps = [(), ("conv1",), ("layer1.0.conv1",), ("layer1.0.conv2",), (), ("fc",)]
    kernels = [False, True, True, True, False, True]
    nodes = [("input0_abcd_acdb", "Reorder", 1.0),        # before any step
             ("/model/relu/Relu_output_0", "FusedConv", 2.0),   # conv1 + relu
             ("/model/layer1/layer1.0/relu/Relu", "Conv", 4.0),  # layer1.0.conv1 + relu
             ("/model/layer1/layer1.0/conv2/Conv", "Conv", 8.0),
             ("/model/layer1/layer1.0/Add", "Add", 16.0),      # with conv2
             ("191", "FullyConnected", 32.0)]                # the one kernel left: fc
    per, lost, names = layers.attach(nodes, steps, kernels)
    assert per == [0.0, 2.0, 4.0, 24.0, 0.0, 32.0]
    assert lost == 1.0 and names == ["input0_abcd_acdb"]


def test_layers_bench_profiles_the_engines_beside_our_steps(tmp_path):
    """bench/layers.py on a small untuned CNN with the engines of the `compare` extra: every
    kernel step gets each engine's nodes, the sums and per-round ratios are reported; an
    engine not installed is named missing."""
    model_file = _small_cnn(tmp_path)
    proc = _run("bench/layers.py", f"{model_file}:make", "--threads", "1", "--rounds", "2",
                "--records", "none", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    (r,) = out["models"].values()
    assert out["bench"] == "layers" and r["sums"]["ours_us"] > 0
    kernels = [row for row in r["steps"] if row["kind"] == "kernel"]
    assert kernels and all(row["ours_us"] > 0 for row in kernels)
    for name in ("onnxruntime", "openvino"):
        if importlib.util.find_spec(name) is None or importlib.util.find_spec("onnx") is None:
            assert name in r["missing"]
            continue
        assert r["sums"][f"{name}_us"] > 0 and r["versions"][name]
        assert all(row[f"{name}_us"] > 0 and row[f"{name}_over_ours"]["median"] > 0
                   for row in kernels)


@pytest.mark.skipif(not cpu_info().amx, reason="bf16 networks need AMX tiles")
def test_layers_bench_in_bf16_runs_our_bf16_network_against_openvinos(tmp_path):
    """--precision bf16: our network for llvm -precision=bf16, OpenVINO asked for bf16."""
    model_file = _small_cnn(tmp_path)
    proc = _run("bench/layers.py", f"{model_file}:make", "--threads", "1", "--rounds", "2",
                "--records", "none", "--precision", "bf16", "--engines", "openvino",
                timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    (r,) = out["models"].values()
    assert out["precision"] == "bf16" and r["sums"]["ours_us"] > 0
    assert "onnxruntime_us" not in r["sums"]
    if importlib.util.find_spec("openvino") is not None and \
            importlib.util.find_spec("onnx") is not None:
        assert r["sums"]["openvino_us"] > 0


def test_layers_bench_refuses_an_unknown_engine_before_any_work():
    proc = _run("bench/layers.py", "resnet18", "--engines", "tensorrt")
    assert proc.returncode != 0 and "--engines 'tensorrt'" in proc.stderr
