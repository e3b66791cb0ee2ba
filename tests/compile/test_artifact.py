"""Saved networks: net.save(path) and raytune_kernels.load(path) give the same outputs, bit
for bit, in a fresh process where Ray, XGBoost and PuLP cannot be imported; and every way a
file can be wrong for this machine is refused with an error that says which."""
import json
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from raytune_kernels import zoo
from raytune_kernels.compile import artifact
from raytune_kernels.compile.api import compile_network
from raytune_kernels.compile.api import load
from raytune_kernels.compile.artifact import MAGIC, ArtifactError
from raytune_kernels.errors import CompileError

BLOCKED = textwrap.dedent("""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("ray", "xgboost", "pulp"):
                raise ImportError("this process may not import " + name)
    sys.meta_path.insert(0, Block())
""")


class Mixed(torch.nn.Module):
    """Convs with a pool (a bordered input), a concat (a native copy), a dense whose N
    the kernel pads, and a PyTorch island."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 16, 1)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        y = torch.cat([torch.relu(self.a(x)), self.b(x)], 1)
        y = torch.nn.functional.max_pool2d(y, 2)
        return torch.special.log_ndtr(self.fc(y.flatten(1)))  # an island


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Mixed and the zoo's BERT layer compiled untuned, saved, with a fresh input and the
    output each gives on it."""
    torch.manual_seed(0)
    out = {}
    bert, bert_in = zoo.MODELS["bert_layer"]()
    for name, model, inputs in (("mixed", Mixed().eval(), (torch.randn(1, 8, 8, 8),)),
                                ("bert", bert, bert_in)):
        with pytest.warns(UserWarning):
            net = compile_network(model, inputs)
        path = str(tmp_path_factory.mktemp(name) / f"{name}.rkn")
        net.save(path)
        x = net.random_inputs(seed=3)
        io = path + ".io.pt"
        torch.save((x, net(*x)), io)
        out[name] = (net, path, io)
    return out


def test_a_fresh_process_without_the_tuning_stack_gets_the_same_outputs(saved):
    paths = [(p, io) for _, p, io in saved.values()]
    code = BLOCKED + textwrap.dedent(f"""
        import torch
        from raytune_kernels.compile.api import load
        for path, io in {paths!r}:
            x, want = torch.load(io)
            got = load(path)(*x)
            assert torch.equal(got, want), (path, (got - want).abs().max())
        assert not {{"ray", "xgboost", "pulp"}} & set(sys.modules)
        print("same")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "same", run.stderr[-3000:]


def test_a_loaded_network_runs_and_reports_like_the_compiled_one(saved):
    net, path, _ = saved["mixed"]
    back = load(path)
    assert [s.kind for s in back.steps] == [s.kind for s in net.steps]
    assert back.threads == net.threads and back.estimated_s == net.estimated_s
    x = back.random_inputs(seed=5)
    assert torch.equal(back(*x), net(*x))
    assert back.benchmark() > 0


def test_the_file_holds_the_packed_weights_and_not_the_graphs_own(saved):
    net, path, _ = saved["bert"]
    originals = sum(p.numel() * p.element_size() for p in net.graph.params.values())
    header = artifact.read(path)[0]
    stored = sum(a["nbytes"] for a in header["arrays"])
    assert originals > 0 and stored < originals * 1.5, (stored, originals)
    back = load(path)
    assert all(p.is_meta for p in back.graph.params.values())
    assert back.graph.shapes == net.graph.shapes
    with pytest.raises(CompileError, match="a network loaded from a file holds its packed"):
        back.first_divergence(back.random_inputs())


def test_arrays_and_tensors_come_back_aligned_typed_and_shared(tmp_path):
    big = np.arange(3 << 20, dtype=np.float32)  # over a huge page
    t = torch.randn(3, 5, dtype=torch.bfloat16)
    state = {"a": big, "again": big, "small": np.arange(6, dtype=np.int64).reshape(2, 3),
             "t": t, "p": torch.nn.Parameter(torch.ones(4)), "view": t[:, 1:],
             "empty": np.zeros(0, np.float32)}
    path = str(tmp_path / "s.rkn")
    artifact.save(path, state, {"kind": "test"})
    _, back = artifact.open_state(path, check_machine=False)
    assert back["a"] is back["again"] and np.array_equal(back["a"], big)
    assert back["a"].ctypes.data % 64 == 0
    assert back["small"].dtype == np.int64 and back["small"].shape == (2, 3)
    assert back["t"].dtype == torch.bfloat16 and torch.equal(back["t"], t)
    assert isinstance(back["p"], torch.nn.Parameter) and back["p"].requires_grad
    assert torch.equal(back["view"], t[:, 1:]) and back["empty"].size == 0


def _rewrite(path: str, dst, header=None, payload=None, cut: int = 0) -> str:
    hdr, body = artifact.read(path)
    hdr = header(hdr) if header else hdr
    body = payload(body) if payload else body
    text = json.dumps(hdr).encode()
    data = MAGIC + struct.pack("<Q", len(text)) + text + body
    out = dst / "bad.rkn"
    out.write_bytes(data[:len(data) - cut] if cut else data)
    return str(out)


def test_damaged_and_foreign_files_are_refused_saying_why(saved, tmp_path):
    _, path, _ = saved["mixed"]
    cases = [
        (lambda: _rewrite(path, tmp_path, header=lambda h: {**h, "format": 99}),
         f"format version 99; this raytune-kernels .* reads version "
         f"{artifact.FORMAT_VERSION}"),
        (lambda: _rewrite(path, tmp_path, cut=100), "truncated"),
        (lambda: _rewrite(path, tmp_path, payload=lambda b: b[:50] + bytes([b[50] ^ 1])
                          + b[51:]), "corrupted: its payload's checksum"),
        (lambda: str(tmp_path / "missing.rkn"), "cannot read"),
        (lambda: _rewrite(path, tmp_path, header=lambda h: {
            **h, "arrays": [{**a, "nbytes": 1 << 60} for a in h["arrays"]]}),
         "header is damaged \\(its sizes"),
    ]
    (tmp_path / "text.rkn").write_text("not a network")
    cases.append((lambda: str(tmp_path / "text.rkn"), "is not a saved raytune-kernels"))
    for make, message in cases:
        with pytest.raises(ArtifactError, match=message):
            load(make())


def test_a_cpu_without_the_kernels_instruction_sets_is_named(saved, monkeypatch):
    _, path, _ = saved["mixed"]
    name, features = artifact.read(path)[0]["machine"]["cpu"], \
        artifact.read(path)[0]["machine"]["features"]
    used = sorted(artifact.isa_features(features))
    assert used, features  # x86-64 always has SSE2 at least
    poorer = ",".join(f"-{f}" if f[1:] == used[-1] else f for f in features.split(","))
    from raytune_kernels.cpu import build

    monkeypatch.setattr(build, "host_cpu", lambda: ("oldcpu", poorer))
    with pytest.raises(ArtifactError, match=f"built for {name} with {used[-1]}, which this "
                                            "CPU \\(oldcpu\\) lacks"):
        load(path)


def test_a_gpu_network_needs_a_gpu_of_its_arch(monkeypatch):
    from raytune_kernels.cuda import device

    machine = {"kind": "cuda", "arch": "sm_90"}
    monkeypatch.setattr(device, "gpu_count", lambda: 0)
    assert "none is visible here" in artifact.machine_problem(machine)
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    monkeypatch.setattr(device, "device_arch", lambda: "sm_80")
    monkeypatch.setattr(device, "device_name", lambda: "NVIDIA A100")
    assert artifact.machine_problem(machine) == (
        "its cubins were built for sm_90, and this GPU (NVIDIA A100) is sm_80: compile the "
        "network for this GPU")
    monkeypatch.setattr(device, "device_arch", lambda: "sm_90")
    assert artifact.machine_problem(machine) is None


@pytest.mark.e2e
def test_resnet18_saved_and_loaded_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    model, inputs = zoo.MODELS["resnet18"]()
    with pytest.warns(UserWarning):
        net = compile_network(model, inputs)
    path, io = str(tmp_path / "r18.rkn"), str(tmp_path / "io.pt")
    net.save(path)
    x = net.random_inputs(seed=1)
    torch.save((x, net(*x)), io)
    code = BLOCKED + textwrap.dedent(f"""
        import torch
        from raytune_kernels.compile.api import load
        x, want = torch.load({io!r})
        assert torch.equal(load({path!r})(*x), want)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
