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


@pytest.mark.parametrize("argv, message", [
    (["tasks", "nosuchnet"], "unknown model 'nosuchnet'"),
    (["tasks", "resnet18", "--target", "rocm"], "unknown target 'rocm'"),
    (["tasks", "/nonexistent.py:make"], "does not exist"),
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
    from raytune_kernels.records import Record, RecordWriter, load_records
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
    from raytune_kernels.records import Record, RecordWriter
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
