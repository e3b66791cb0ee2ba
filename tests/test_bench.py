"""bench/kernels.py and bench/network.py on a cuda target: --target parsing, and without a
GPU a one-line error and exit status 2 before any work (run here as subprocesses, as a
user would); on a machine with a GPU, each bench end to end at a small budget."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from raytune_kernels import Target
from raytune_kernels.cuda import torch_timing as torch_gpu
from raytune_kernels.cuda.build import nvrtc_unavailable

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


@gpu_only
def test_kernels_bench_on_the_gpu(tmp_path):
    records = str(tmp_path / "k.jsonl")
    proc = _run("bench/kernels.py", "--target", "cuda", "--limit", "2", "--trials", "4",
                "--rounds", "1", "--records", records, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    gpu = torch_gpu.gpu_name()
    assert out["device"] == gpu and out["target"] == "cuda" and out["tf32"] is False
    assert out["record_targets"] and all(t.startswith("cuda -arch=sm_")
                                         for t in out["record_targets"])
    assert len(out["tasks"]) == 2 and out["failed"] == 0
    assert all(r["ours_us"] > 0 and r["torch_us"] > 0 for r in out["tasks"])
    assert f"kernels on {gpu}, target 'cuda'" in proc.stderr  # the table's header


@gpu_only
def test_network_bench_on_the_gpu(tmp_path):
    factory = tmp_path / "tiny.py"
    factory.write_text(TINY_GPU)
    proc = _run("bench/network.py", f"{factory}:make", "--target", "cuda", "--trials", "8",
                "--rounds", "1", "--records", str(tmp_path / "n.jsonl"), "--fallback",
                "torch", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["device"] == torch_gpu.gpu_name() and out["target"] == "cuda"
    assert out["ours_ms"] > 0 and out["torch_ms"]["eager"] > 0
    assert set(out["torch_ms"]) == {"eager", "channels_last", "compile"}
    # a baseline is timed or its failure reported, never both, never neither
    assert all((v is None) == (k in out["torch_failed"]) for k, v in out["torch_ms"].items())


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
    assert set(fns) | set(missing) == {"onnxruntime", "openvino"}
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

    from raytune_kernels.tune.timing import TimingOptions

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
