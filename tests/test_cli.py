import subprocess
import sys
import textwrap

import pytest

from raytune_kernels.cli import main


def test_tasks_command_prints_table_and_totals(capsys):
    assert main(["tasks", "resnet18", "--target", "cuda"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "Tasks for target cuda"
    assert sum(1 for line in lines if line.strip()[:1].isdigit() and "conv2d" in line) == 18
    assert "21 tasks, 23 layers, 3.6" in lines[-1]
    assert "layer1.0.conv1, layer1.1.conv1" in out


def test_tasks_from_a_factory_file(tmp_path, capsys):
    path = tmp_path / "mymodel.py"
    path.write_text(textwrap.dedent("""
        import torch
        def make():
            return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), (torch.randn(2, 8),)
    """))
    assert main(["tasks", f"{path}:make"]) == 0
    out = capsys.readouterr().out
    assert "dense 2x8 -> 2x4 +bias+relu" in out and "1 tasks, 1 layers" in out


def test_tasks_runs_unknown_ops_as_islands_and_strict_refuses_them(tmp_path, capsys):
    path = tmp_path / "softshrink.py"
    path.write_text(textwrap.dedent("""
        import torch
        def make():
            net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Softshrink())
            return net, (torch.randn(2, 8),)
    """))
    with pytest.warns(UserWarning, match="Softshrink in '1'"):
        assert main(["tasks", f"{path}:make"]) == 0
    assert "dense 2x8 -> 2x4 +bias" in capsys.readouterr().out
    assert main(["tasks", f"{path}:make", "--strict"]) == 2
    assert "unsupported op 'Softshrink' in layer '1'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["tasks", "nosuchnet"], "unknown model 'nosuchnet'"),
    (["tasks", "resnet18", "--target", "rocm"], "unknown target 'rocm'"),
    (["tasks", "/nonexistent.py:make"], "does not exist"),
    (["tune", "resnet18", "--trials", "0"], "trials must be a positive integer, got 0"),
    (["tune", "resnet18", "--batch", "-1"], "batch must be a positive integer, got -1"),
    (["tune", "resnet18", "--builders", "-1"], "num_builders must be a positive integer"),
    (["tune", "resnet18", "--measurers", "-1"], "num_measurers must be a positive integer"),
    (["tune", "resnet18", "--seconds", "0"], "seconds must be a positive number or None"),
    (["compile", "resnet18", "--records", "r.jsonl", "--threads", "0"],
     "threads must be a positive integer, got 0"),
    (["compile", "resnet18", "--records", "r.jsonl", "--refine", "-1"],
     "refine must be a count of records (0: off), got -1"),
])
def test_errors_are_named(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_console_entry_point_runs_as_module():
    proc = subprocess.run([sys.executable, "-m", "raytune_kernels", "tasks", "bert_layer"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "8 tasks, 11 layers" in proc.stdout


def test_distill_command(tmp_path, capsys):
    from raytune_kernels.tune.records import Record, RecordWriter, load_records
    src, dst = str(tmp_path / "all.jsonl"), str(tmp_path / "best.jsonl")
    with RecordWriter(src) as w:
        w.write_batch([Record("a", "llvm", "cpu", {"i": i}, (float(i + 1),)) for i in range(5)])
    assert main(["distill", src, "-o", dst, "--top", "2"]) == 0
    assert "kept 2 record(s)" in capsys.readouterr().out
    assert [r.config["i"] for r in load_records(dst)] == [0, 1]
    assert main(["distill", str(tmp_path / "missing.jsonl"), "-o", dst]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_plot_command_draws_curves(tmp_path, capsys):
    import random
    from raytune_kernels.tune.records import Record, RecordWriter
    src, png = str(tmp_path / "r.jsonl"), str(tmp_path / "curve.png")
    rng = random.Random(0)
    with RecordWriter(src) as w:
        w.write_batch([Record(k, "llvm", "cpu", {"i": i}, (rng.uniform(1, 2) / (i + 1),),
                              timestamp=100.0 + i) for i in range(20) for k in ("a", "b")])
    assert main(["plot", src, "-o", png]) == 0
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["plot", str(empty), "-o", png]) == 2
    assert "no records to plot" in capsys.readouterr().err


def test_plot_command_weighs_the_tasks_of_a_model(tmp_path, capsys):
    from raytune_kernels import extract_tasks, zoo
    from raytune_kernels.tune.records import Record, RecordWriter
    factory = tmp_path / "mlp.py"
    factory.write_text(textwrap.dedent("""
        import torch

        def make():
            fc = torch.nn.Linear(16, 16)
            return torch.nn.Sequential(fc, torch.nn.ReLU(), fc), (torch.randn(2, 16),)
    """))
    model = f"{factory}:make"
    keys = [t.key for t in extract_tasks(*zoo.load(model))]
    src, png = str(tmp_path / "r.jsonl"), str(tmp_path / "curve.png")
    with RecordWriter(src) as w:
        w.write_batch([Record(k, "llvm", "cpu", {}, (1e-3,), timestamp=1.0)
                       for k in keys + ["not-of-the-model"]])
    assert main(["plot", src, "-o", png, "--model", model]) == 0
    assert capsys.readouterr().out == f"wrote {png}\n"
    other = str(tmp_path / "other.jsonl")
    with RecordWriter(other) as w:
        w.write_batch([Record("not-of-the-model", "llvm", "cpu", {}, (1e-3,))])
    assert main(["plot", other, "-o", png, "--model", model]) == 2
    assert "no records to plot of the model's tasks" in capsys.readouterr().err


def _gpu_problem():
    from raytune_kernels.cuda.torch_timing import gpu_problem
    return gpu_problem()


TINY_GPU = textwrap.dedent("""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)
            self.fc = torch.nn.Linear(32 * 8 * 8, 64)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    def make():
        torch.manual_seed(0)
        return Tiny().eval(), (torch.randn(1, 16, 8, 8),)
""")


@pytest.mark.skipif(_gpu_problem() is None, reason="a CUDA GPU is visible here")
@pytest.mark.parametrize("target", ["cuda", "cuda -arch=sm_90"])
def test_compile_for_cuda_without_a_gpu_names_the_missing_gpu(target, tmp_path, capsys,
                                                             monkeypatch):
    from raytune_kernels import zoo

    def load(spec):
        raise AssertionError("the model is built before the GPU check")
    monkeypatch.setattr(zoo, "load", load)
    records = tmp_path / "r.jsonl"
    records.write_text("")
    assert main(["compile", "resnet18", "--records", str(records), "--target", target]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"raytune-kernels: error: target {target!r} needs a CUDA GPU, "
                            f"and no CUDA GPU is visible here ({_gpu_problem()})\n")


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_problem() is not None, reason=f"needs a CUDA GPU: {_gpu_problem()}")
def test_compile_for_cuda_times_pytorch_on_the_gpu(tmp_path, capsys, request):
    from raytune_kernels.cuda.build import nvrtc_unavailable
    from raytune_kernels.cuda.torch_timing import gpu_name

    if nvrtc_unavailable() is not None:
        pytest.skip(f"NVRTC unavailable: {nvrtc_unavailable()}")
    request.getfixturevalue("ray_session")  # tuning needs Ray with the GPU
    factory, records = tmp_path / "tiny.py", str(tmp_path / "r.jsonl")
    factory.write_text(TINY_GPU)
    assert main(["tune", f"{factory}:make", "--target", "cuda", "--trials", "8",
                 "--records", records]) == 0
    capsys.readouterr()
    assert main(["compile", f"{factory}:make", "--records", records, "--target", "cuda",
                 "--fallback", "torch"]) == 0
    out = capsys.readouterr().out
    assert f"on {gpu_name()} (target cuda), CUDA events, TF32 off" in out
