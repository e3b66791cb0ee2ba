"""compile_network() on a cuda target without a GPU: real kernels built by NVRTC from
records, the plan (packed weights, arena offsets, launch order, torch steps) run through
the CPU CUDA emulator and compared with the model; and, where a GPU is visible, the same
network run by cupy and benchmarked with CUDA events."""
import dataclasses
import math
import random
import threading

import numpy as np

import pytest
import torch

import raytune_kernels as rk
from tests.support import cuda_emulate
from raytune_kernels.cuda.build import build_cuda, compile_cuda, nvrtc_unavailable
from raytune_kernels.cuda.render import cuda_space_for, render_cuda
from raytune_kernels.space import Config
from raytune_kernels.measure import MeasureResult
from raytune_kernels.errors import CompileError
from raytune_kernels.compile import cuda_plan
from raytune_kernels.compile.api import cuda_records
from raytune_kernels.compile.cuda_network import (GpuNetwork, check_gpu_network,
                                                  compile_network_cuda)
from raytune_kernels.compile.cuda_plan import (ALIGN, NCHW, NHWC, GBuf, GpuStep, assign_offsets,
                                               same_order, to_layout)
from raytune_kernels.compile.report import output_error, rounded_gemms
from raytune_kernels.frontend.partition import TaskStep
from raytune_kernels.precision import tolerance
from raytune_kernels.tune.records import record_of
from raytune_kernels.timing import TimingOptions

from tests.support.gpu_emulator import EmulatorDevice
from tests.cuda.test_measure import _has_gpu

ARCH = "sm_90"
TARGET = f"cuda -arch={ARCH}"
pytestmark = [
    pytest.mark.skipif(nvrtc_unavailable() is not None,
                       reason=f"NVRTC unavailable: {nvrtc_unavailable()}"),
    pytest.mark.skipif(cuda_emulate.compiler() is None,
                       reason="no C++ compiler for the CUDA emulator")]


def tiny():
    """conv 16->32 3x3 + relu, max pool, flatten, linear: three tasks and a reshape.
    Batch 2: a 1-row dense with 10 outputs has no CUDA GEMM tiling."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 3 * 3, 10)).eval()
    return model, (torch.randn(2, 16, 6, 6),)


def cuda_records_for(model, inputs, arch=ARCH, skip=(), seed=0, layout="NCHW",
                     times=None, precision="fp32"):
    """One config per task that really builds for `arch`, in `layout` where the task has
    layouts (on tensor cores where the precision has them), recorded with a made-up time
    (what is checked here is the network, not the speed): `times` maps an op to its
    seconds, 1e-5 otherwise."""
    rng, out = random.Random(seed), []
    target = str(rk.parse_target(f"cuda -arch={arch} -precision={precision}"))
    for task in rk.extract_tasks(model, inputs, target="cuda"):
        if task.compute.op in skip:
            continue
        space = cuda_space_for(task.compute, precision)
        mma = dict(getattr(space, "parts", ())).get("mma")
        for _ in range(200):
            cfg = space.sample(rng) if mma is None else \
                Config(tuple(sorted(mma.sample(rng).knobs + (("kernel", "mma"),))))
            if cfg.get("layout", layout) != layout:
                continue
            built = build_cuda(task.compute, cfg, arch)
            if built.error is None:
                break
        assert built.error is None and cfg.get("layout", layout) == layout, built.error
        t = (times or {}).get(task.compute.op, 1e-5)
        result = MeasureResult(times=(t, t * 1.1), build_s=built.seconds)
        out.append(record_of(task.key, target, "emulated", cfg.to_json(), result))
    return out


@pytest.fixture(scope="module")
def case():
    model, inputs = tiny()
    return model, inputs, cuda_records_for(model, inputs)


@pytest.fixture(scope="module")
def net(case):
    model, inputs, records = case
    return compile_network_cuda(model, inputs, records, TARGET, device=EmulatorDevice)


def test_the_plan_runs_on_the_emulator_and_equals_the_model(case, net):
    model, _, _ = case
    assert [s.kind for s in net.steps] == ["kernel"] * 3  # flatten is a view, no step
    assert all(s.binary[:4] == b"\x7fELF" for s in net.steps)  # cubins for sm_90
    before = net.device.launches
    x = torch.randn(2, 16, 6, 6)
    with torch.no_grad():
        want = model(x)
    got = net(x)
    assert net.device.launches == before + 3
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_weights_are_packed_once_and_buffers_never_overlap_while_live(net):
    plan = net.plan
    params = dict(net.part.graph.params)
    scratch = {op.index for s in plan.steps if s.kernel is not None
               for op, b in zip(s.operands, s.kernel.buffers) if b.role == "scratch"}
    packed = [c for i, c in enumerate(plan.consts) if i not in scratch]
    assert len(packed) == len(params)  # each parameter packed once, as the kernel reads
    assert sorted(c.size for c in packed) == sorted(p.numel() for p in params.values())
    bufs = plan.inputs + plan.outputs + [s.out for s in plan.steps]
    assert all(b.offset >= 0 and b.offset % ALIGN == 0 for b in bufs)
    assert max(b.offset + b.size for b in bufs) <= plan.arena_floats
    for s in plan.steps:
        for r in s.reads:
            assert r.offset + r.size <= s.out.offset or s.out.offset + s.out.size <= r.offset
    for p in plan.inputs + plan.outputs:  # pinned: no other buffer shares their range
        for b in bufs:
            if b is not p and b.root is not p.root:
                assert b.offset + b.size <= p.offset or p.offset + p.size <= b.offset


def test_profile_and_fidelity_run_every_step(net, capsys):
    once = TimingOptions(warmup=0, min_repeat_ms=0, repeats=1)  # the emulator is slow
    before = net.device.captures
    prof = net.profile(opts=once)
    assert net.device.captures - before == 3  # each step timed replayed from a graph
    assert [r.name for r in prof.rows] == ["0", "2", "4"]
    assert all(r.ours_s > 0 and r.torch_s > 0 and r.estimate_s == pytest.approx(1.05e-5)
               for r in prof.rows)
    assert "ours us" in capsys.readouterr().out
    text = net.fidelity(prof.end_to_end_s, prof)
    assert net.estimated_s == pytest.approx(3 * 1.05e-5)
    assert text.startswith("estimated 0.03") and "not in the estimate" not in text
    assert "kernels slower in the network than in their records: " in text


def test_a_dead_buffer_range_is_reused():
    x, d = GBuf(100, (100,), pinned=True), GBuf(70, (70,), pinned=True)
    a, b, c = GBuf(100, (100,)), GBuf(130, (130,)), GBuf(90, (90,))
    steps = [GpuStep(n, "glue", (), [i], o) for n, i, o in
             [("a", x, a), ("b", a, b), ("c", b, c), ("d", c, d)]]
    arena = assign_offsets(steps, [x, d])
    assert (x.offset, d.offset, a.offset, b.offset) == (0, 2 * ALIGN, 4 * ALIGN, 6 * ALIGN)
    assert c.offset == a.offset and arena == 9 * ALIGN  # a is dead once b is written


def test_every_kernel_is_built_once_on_the_prebuild_threads(case, monkeypatch):
    model, inputs, records = case
    calls = []

    def counted(source, arch, name="kernel.cu", options=()):
        calls.append((name, threading.current_thread() is threading.main_thread()))
        return compile_cuda(source, arch, name, options)
    monkeypatch.setattr(cuda_plan, "compile_cuda", counted)
    net = compile_network_cuda(model, inputs, records, TARGET, device=EmulatorDevice)
    kernels = [s for s in net.steps if s.kind == "kernel"]
    assert len(calls) == len(kernels) == 3 and not any(main for _, main in calls)
    assert sorted(n for n, _ in calls) == sorted(f"{s.kernel.name}.cu" for s in kernels)


def test_a_record_whose_config_no_longer_renders_is_named(case):
    model, inputs, records = case
    stale = [dataclasses.replace(r, config={"tiles": 3}) if r is records[0] else r
             for r in records]
    with pytest.raises(CompileError, match=r"layer 0 \(task \w+, conv2d .*no longer renders"):
        compile_network_cuda(model, inputs, stale, TARGET, device=EmulatorDevice)


def test_records_of_another_arch_alone_are_refused_naming_it(case):
    model, inputs, records = case
    other = [dataclasses.replace(r, target="cuda -arch=sm_80") for r in records]
    with pytest.raises(CompileError, match="holds no cuda record for sm_90 in fp32, only "
                                           "for cuda -arch=sm_80: tune this target"):
        cuda_records(other, ARCH, plain_ok=False)


@pytest.mark.parametrize("precision", ["tf32", pytest.param("bf16", marks=pytest.mark.e2e)])
def test_a_tensor_core_network_matches_the_model_within_its_precision(precision):
    model, inputs = tiny()
    records = cuda_records_for(model, inputs, precision=precision)
    assert sum(r.config.get("kernel") == "mma" for r in records) == 2  # the conv, the dense
    target = f"{TARGET} -precision={precision}"
    net = compile_network_cuda(model, inputs, records, target, device=EmulatorDevice)
    assert net.graph and net.device.captures == 1  # every call replays one capture
    # in tf32 the conv's and the dense's weights are rounded once, when packed, and read
    # with no conversion; fp16 and bf16 convert them as they are read
    rounded = [s for s in net.steps if "__float_as_uint(" in s.kernel.source]
    assert len(rounded) == (2 if precision == "tf32" else 0)
    for s in rounded:
        weights = net.plan.consts[s.operands[1].index]
        assert not (weights.view(np.uint32) & 0x1FFF).any()
    err = output_error(net(*inputs), model(*inputs))
    assert 1e-6 < err <= tolerance(precision).network
    assert net.checked_within == tolerance(precision).network  # this model's bound
    # the kernels round what report.rounded_gemms rounds, and only that: the network is
    # far nearer that emulation than the float32 model (accumulation order apart)
    with torch.no_grad(), rounded_gemms(precision):
        emulated = model(*inputs)
    assert output_error(net(*inputs), emulated) < err / 100
    with pytest.raises(CompileError, match=f"holds no cuda record for sm_90 in fp32, only "
                                           f"for cuda -arch=sm_90 -precision={precision}"):
        cuda_records(records, ARCH, plain_ok=False)
    # checked against the target's tolerance: the fp32 bound refuses the rounding
    with pytest.raises(CompileError, match="differs from the model"):
        compile_network_cuda(model, inputs, records, target, device=EmulatorDevice,
                             atol=1e-7)


class Attention(torch.nn.Module):
    """One attention block as Hugging Face writes it: projections, heads split by view and
    permute, scaled_dot_product_attention with an additive mask, heads merged, an output
    dense."""

    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))

    def forward(self, x, mask):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa
        a = torch.nn.functional.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(x)), split(self.v(x)), attn_mask=mask)
        return self.o(a.transpose(1, 2).reshape(b, t, d))


def test_untuned_attention_on_tensor_cores_rounds_as_the_check_assumes():
    """An attention block untuned in tf32 (the denses and both batched matmuls on tensor
    cores, softmax in float32): within its bound of the model, and equal to the model run
    with every GEMM operand rounded to tf32 (report.rounded_gemms, what the bound is made
    of) up to float32's accumulation order."""
    torch.manual_seed(0)
    model = Attention().eval()
    x = torch.randn(2, 16, 32)
    mask = torch.zeros(2, 1, 16, 16).masked_fill(torch.rand(2, 1, 16, 16) > 0.8, -1e9)
    mask[..., 0] = 0.0  # an additive mask, an input as Hugging Face's is
    with pytest.warns(UserWarning, match="untuned default"):
        net = compile_network_cuda(model, (x, mask), [], f"{TARGET} -precision=tf32",
                                   device=EmulatorDevice)
    ops = [net.part.task(s.key).compute.op for s in net.steps if s.key]
    # the three projections of x are one kernel (sibling_denses), the output's another
    assert sorted(ops) == ["dense"] * 2 + ["matmul"] * 2 + ["softmax"]
    with torch.no_grad():
        want = model(x, mask)
        with rounded_gemms("tf32"):
            emulated = model(x, mask)
    got = net(x, mask)
    err = output_error(got, want)
    assert 1e-5 < err <= net.checked_within
    assert output_error(got, emulated) < err / 50


class Merged(torch.nn.Module):
    """Heads split by a permute that a matmul reads (in place) and an add reads (a copy)."""

    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads, self.q, self.k = heads, torch.nn.Linear(d, d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        return q @ k.transpose(-1, -2) + q.sum(-1, keepdim=True)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_attention_reads_and_writes_its_heads_in_place(precision, tmp_path):
    """The head split (queries, keys transposed, values) and merge of an attention block
    are matmuls reading and writing the projections' buffers at permuted strides: no copy
    step is left; the three projections of one input are one kernel, each writing its
    part of one buffer; the output matches, each step still checks against its value (the
    context's step against the merged heads it now writes, the projections' kernel against
    each projection), and the network saves and loads."""
    torch.manual_seed(0)
    model = Attention().eval()
    x, mask = torch.randn(2, 16, 32), torch.zeros(2, 1, 16, 16)
    with pytest.warns(UserWarning, match="untuned default"):
        net = compile_network_cuda(model, (x, mask), [], f"{TARGET} -precision={precision}",
                                   device=EmulatorDevice)
    assert [s.kind for s in net.steps] == ["kernel"] * 5
    qkv = net.steps[0]
    assert qkv.name == "q + k + v" and qkv.out.shape == (3, 32, 32)
    assert [(v, b.offset - qkv.out.offset) for v, b in qkv.parts] == \
        [("q", 0), ("k", 1024), ("v", 2048)]
    with torch.no_grad():
        want = model(x, mask)
    assert output_error(net(x, mask), want) <= net.checked_within
    assert net.first_divergence((x, mask), net.checked_within).startswith("no single step")
    if precision != "fp32":  # each projection is compared: the first is named
        assert "step q + k + v (kernel" in net.first_divergence((x, mask), 1e-9)
        assert "value q," in net.first_divergence((x, mask), 1e-9)
    context = next(s for s in net.steps if s.out.shape == (2, 16, 2, 16))  # heads merged
    assert net.part.task(context.key).compute.output.shape == (2, 2, 16, 16)
    path = str(tmp_path / "attention.rkn")
    net.save(path)
    back = rk.load(path, device=EmulatorDevice)
    assert torch.equal(back(x, mask), net(x, mask))


def test_without_its_rewrites_the_plan_launches_and_copies_every_step():
    """rewrites=False (the baseline bench/network.py --plain times): each projection its
    own kernel, the four permutes PyTorch copies, tf32 weights converted in the kernels;
    the same model either way."""
    torch.manual_seed(0)
    model = Attention().eval()
    x, mask = torch.randn(2, 16, 32), torch.zeros(2, 1, 16, 16)
    nets = {}
    for rewrites in (True, False):
        with pytest.warns(UserWarning, match="untuned default"):
            nets[rewrites] = compile_network_cuda(model, (x, mask), [],
                                                  f"{TARGET} -precision=tf32",
                                                  device=EmulatorDevice, rewrites=rewrites)
    plain, rewritten = nets[False], nets[True]
    assert [s.kind for s in plain.steps].count("glue") == 4
    assert [s.kind for s in plain.steps].count("kernel") == 7
    assert not any(s.parts for s in plain.steps)
    assert not any("__float_as_uint" in s.kernel.source for s in plain.steps if s.kernel)
    assert len(rewritten.steps) == 5
    # the projections' kernel and the output's read rounded weights; the attention
    # matmuls' operands are activations, converted as they are read
    assert sum("__float_as_uint" in s.kernel.source for s in rewritten.steps) == 2
    with torch.no_grad():
        want = model(x, mask)
    for net in nets.values():
        assert output_error(net(x, mask), want) <= net.checked_within


def test_sibling_denses_of_other_configs_or_inputs_run_apart():
    """Projections of one input and one task but tuned configs that differ are not one
    kernel (records name one config a task: here the keys' layer is given TORCH), nor are
    denses of different inputs."""
    torch.manual_seed(0)
    model = Attention().eval()
    x, mask = torch.randn(2, 16, 32), torch.zeros(2, 1, 16, 16)
    from raytune_kernels.frontend.capture import capture
    from raytune_kernels.frontend.partition import partition
    from raytune_kernels.layout.graph import Candidate
    from raytune_kernels.cuda.render import default_config
    part = partition(capture(model, (x, mask)))
    cfgs = {t.key: default_config(t.compute) for t in part.tasks}
    chosen = [Candidate(NCHW, NCHW, 1e-5, cfgs[s.key]) if isinstance(s, TaskStep) else None
              for s in part.steps]
    groups = cuda_plan.sibling_denses(part, chosen)
    assert [[s.layer for s in g.steps] for g in groups.values()] == [["q", "k", "v"]]
    keys = next(i for i, s in enumerate(part.steps) if isinstance(s, TaskStep) and
                s.layer == "k")
    chosen[keys] = Candidate(NCHW, NCHW, 1e-5, "torch")
    groups = cuda_plan.sibling_denses(part, chosen)
    assert [[s.layer for s in g.steps] for g in groups.values()] == [["q", "v"]]


def test_a_permute_read_by_other_steps_or_tiled_otherwise_is_still_copied():
    """A split read by a matmul and by a sum is copied (the sum reads it contiguous);
    keys of a head width of 6 are copied when the scores' config loads 16 bytes of them
    along the tokens (read in place, they run along the head width, where 6 floats admit
    no 16-byte load); the queries are still read in place."""
    torch.manual_seed(0)
    model = Merged().eval()
    x = torch.randn(2, 16, 32)
    with pytest.warns(UserWarning, match="untuned default"):
        net = compile_network_cuda(model, (x,), [], TARGET, device=EmulatorDevice)
    assert sum(s.kind == "glue" for s in net.steps) == 1  # the shared split; k^T read in place
    torch.manual_seed(0)
    model, x = Attention(d=24, heads=4).eval(), torch.randn(1, 16, 24)
    mask = torch.zeros(1, 1, 16, 16)
    records = []
    for task in rk.extract_tasks(model, (x, mask), target="cuda"):
        space = list(cuda_space_for(task.compute))
        scores = task.compute.op == "matmul" and task.compute.inputs[1].shape[-1] == 16
        cfg = next(c for c in space if not scores or c["vb"] == 4)
        records.append(record_of(task.key, TARGET, "emulated", cfg.to_json(),
                                 MeasureResult(times=(1e-5, 1.1e-5))))
    net = compile_network_cuda(model, (x, mask), records, TARGET, device=EmulatorDevice)
    glue = [s for s in net.steps if s.kind == "glue"]
    assert len(glue) == 1 and glue[0].out.shape == (1, 4, 6, 16)  # the keys, transposed
    with torch.no_grad():
        assert output_error(net(x, mask), model(x, mask)) <= net.checked_within


def test_a_network_that_tf32_itself_costs_more_is_held_to_that_cost():
    """Two nearly equal convs subtracted: tf32 rounding alone moves the output past the
    table's 1e-2 of its scale, so the check holds the network to twice what the model run
    with rounded operands loses (report.network_bound), and a tighter atol still fails."""
    from raytune_kernels.compile.report import network_bound
    from tests.compile.test_precision_bound import Cancelling
    torch.manual_seed(0)
    model, x = Cancelling().eval(), (torch.randn(1, 16, 8, 8),)
    with pytest.warns(UserWarning, match="untuned default"):
        net = compile_network_cuda(model, x, [], f"{TARGET} -precision=tf32",
                                   device=EmulatorDevice)
    bound, why = network_bound(model, x, "tf32")
    err = output_error(net(*x), model(*x))
    assert tolerance("tf32").network < err <= bound == net.checked_within
    with pytest.raises(CompileError, match=r"limit 0\.01\);"), \
            pytest.warns(UserWarning, match="untuned default"):
        compile_network_cuda(model, x, [], f"{TARGET} -precision=tf32",
                             device=EmulatorDevice, atol=1e-2)


def test_an_untuned_tensor_core_network_runs_small_blocks_and_times_its_phases(capsys):
    """Without records in tf32 every GEMM runs the rule's small-block tensor-core config
    for the arch's SMs (cuda.render.default_config), the network still matches the model
    within tf32's tolerance, and the compile names the seconds of each of its phases."""
    from raytune_kernels.cuda.gpu import gpu_info
    from raytune_kernels.cuda.render import default_config
    model, inputs = tiny()
    with pytest.warns(UserWarning, match="untuned default"):
        net = compile_network_cuda(model, inputs, [], f"{TARGET} -precision=tf32",
                                   device=EmulatorDevice, verbose=True)
    gemms = 0
    for s in net.steps:
        compute = net.part.task(s.key).compute if s.key else None
        if compute is not None and compute.op in ("conv2d", "dense"):
            cfg = default_config(compute, "tf32", gpu_info(ARCH).sms)
            assert cfg["kernel"] == "mma" and \
                s.kernel.source == render_cuda(compute, cfg, rounded=True).source
            gemms += 1
    assert gemms == 2
    assert output_error(net(*inputs), model(*inputs)) <= tolerance("tf32").network
    assert list(net.compile_phases) == ["capture", "layouts", "build", "load and capture",
                                        "check"]
    assert "; took capture " in capsys.readouterr().out


def test_a_split_k_kernel_gets_its_scratch_buffers_from_the_plan():
    model, inputs = tiny()
    records = cuda_records_for(model, inputs, precision="fp16")
    conv = next(r for r in records if r.config.get("layout") is not None)
    task = next(t for t in rk.extract_tasks(model, inputs) if t.key == conv.task_key)
    part = dict(cuda_space_for(task.compute, "fp16").parts)["mma"]
    at = part.coupled_names.index("split")
    combo = next(c for c in part.coupled if c[at] == 2 and c[0] == "NCHW")
    split = dataclasses.replace(conv, config={**dict(zip(part.coupled_names, combo)),
                                              "kernel": "mma", "precision": "fp16"})
    records = [split if r is conv else r for r in records]
    net = compile_network_cuda(model, inputs, records, f"{TARGET} -precision=fp16",
                               device=EmulatorDevice)
    step = next(s for s in net.steps if s.key == conv.task_key)
    roles = [b.role for b in step.kernel.buffers]
    assert roles.count("scratch") == 2 and len(step.operands) == len(roles) - 1
    assert not net.plan.consts[step.operands[-1].index].any()  # the counters start at 0
    for _ in range(2):
        assert output_error(net(*inputs), model(*inputs)) <= tolerance("fp16").network


def test_a_step_alone_reads_its_weights_from_rotating_copies(net):
    """profile()'s conv and dense steps: each launch reads the next copy of its weights
    (copies covering twice the device's L2, as the records were timed) and computes what
    the network's own launch does; the pool has no weights and is launched as it is."""
    from raytune_kernels.cuda.device import weight_copies
    net(*net.random_inputs())
    for s, call in zip(net.steps, net._calls):
        cold = net._cold(s)
        if s.key is None or net.part.task(s.key).compute.op not in ("conv2d", "dense"):
            assert cold is None
            continue
        weights = net.device.constant(s.operands[1])
        copies = weight_copies(weights.numel() * 4, net.device.cache_bytes())
        assert copies >= 2 and copies * weights.numel() * 4 >= 2 * net.device.cache_bytes()
        call()
        want = net.device.tensor(s.out).clone()
        net.device.weight_copies_read.clear()
        for _ in range(copies):
            net.device.tensor(s.out).fill_(float("nan"))
            cold()
            assert torch.equal(net.device.tensor(s.out), want)
        assert len(net.device.weight_copies_read) == copies - 1  # and the weights themselves


def test_graph_off_launches_step_by_step(case):
    model, inputs, records = case
    net = compile_network_cuda(model, inputs, records, TARGET, device=EmulatorDevice,
                               graph=False)
    assert not net.graph and net.device.captures == 0
    before = net.device.launches
    assert output_error(net(*inputs), model(*inputs)) < 1e-4
    assert net.device.launches - before == sum(s.kernel is not None for s in net.steps)


def test_a_wrong_step_is_named(case, net):
    model, inputs, _ = case
    fresh = GpuNetwork(net.plan, EmulatorDevice(net.plan))
    fresh.device.consts[1].add_(1.0)  # the conv's bias (constants come in operand order)
    with pytest.raises(CompileError, match=r"first divergence at step 0 \(kernel"):
        check_gpu_network(fresh, model, inputs, 1e-3)


def test_missing_records_run_an_untuned_default_named_in_a_warning(case):
    """No record for the pool (or none at all): its default config runs, the network still
    equals the model, and the warning names what is untuned."""
    model, inputs, records = case
    few = [r for r in records if "max_pool2d" not in _describe(model, inputs, r.task_key)]
    for recs, count in ((few, 1), ([], 3)):
        with pytest.warns(UserWarning, match=rf"{count} task\(s\) without a cuda record "
                                             r"for sm_90 run an untuned default"):
            net = compile_network_cuda(model, inputs, recs, TARGET, device=EmulatorDevice)
        assert [s.kind for s in net.steps if s.kind != "transform"] == ["kernel"] * 3
        with torch.no_grad():
            assert torch.allclose(net(*inputs), model(*inputs), atol=1e-4, rtol=1e-4)
    with pytest.raises(CompileError, match="no cuda record for sm_80 in fp32, only for cuda -arch=sm_90"):
        cuda_records(records, "sm_80", plain_ok=False)  # records are per arch


def _describe(model, inputs, key):
    return next(t.compute.describe() for t in rk.extract_tasks(model, inputs) if t.key == key)


def test_fallback_torch_runs_the_missing_step_in_torch(case):
    model, inputs, records = case
    few = [r for r in records if "max_pool2d" not in _describe(model, inputs, r.task_key)]
    net = compile_network_cuda(model, inputs, few, TARGET, fallback="torch",
                               device=EmulatorDevice)
    assert [(s.name, s.kind) for s in net.steps] == [("0", "kernel"), ("2", "torch"),
                                                      ("4", "kernel")]
    with pytest.raises(CompileError, match="fallback must be None or 'torch'"):
        compile_network_cuda(model, inputs, records, TARGET, fallback="onnx")


def _steps(net):
    return [(s.name, s.kind, s.out.layout) for s in net.steps]


def test_layouts_that_disagree_get_a_transform(case):
    model, inputs, records = case
    nhwc = cuda_records_for(model, inputs, layout=NHWC)
    conv = rk.extract_tasks(model, inputs, target="cuda")[0].key
    mixed = [r for r in nhwc if r.task_key == conv] + \
        [r for r in records if r.task_key != conv]
    net = compile_network_cuda(model, inputs, mixed, TARGET, device=EmulatorDevice)
    assert _steps(net) == [
        ("input_1: NCHW -> NHWC", "transform", NHWC), ("0", "kernel", NHWC),
        ("_1: NHWC -> NCHW", "transform", NCHW), ("2", "kernel", NCHW),
        ("4", "kernel", NCHW)]
    assert net.steps[2].reads == [net.steps[1].out]
    # the weight as the NHWC kernel reads it: [K][kh][kw][C]
    w = dict(net.part.graph.params)[next(a for a in net.part.steps[0].args
                                         if a in net.part.graph.params)]
    assert any(c.shape == (32, 3, 3, 16) and np.array_equal(c, w.permute(0, 2, 3, 1).numpy())
               for c in net.plan.consts)
    with pytest.raises(CompileError, match="2-D value from NCHW to NHWC"):
        to_layout(torch.zeros(2, 3), NCHW, NHWC)
    x = torch.randn(2, 3, 4, 5)
    assert torch.equal(to_layout(x, NCHW, NHWC), x.permute(0, 2, 3, 1))
    assert torch.equal(to_layout(to_layout(x, NCHW, NHWC), NHWC, NCHW), x)


def test_each_transform_is_timed_once_a_plan():
    """Three convs of one shape in a row: the plan weighs the same two transforms at each
    of its three edges, and the device times each once."""
    from raytune_kernels.compile.cuda_plan import choose_layouts
    from raytune_kernels.frontend.capture import capture
    from raytune_kernels.frontend.partition import partition
    from raytune_kernels.layout.graph import Candidate
    model = torch.nn.Sequential(*[torch.nn.Conv2d(16, 16, 3, padding=1) for _ in range(3)])
    part = partition(capture(model.eval(), (torch.randn(1, 16, 8, 8),)))
    cands = [[Candidate(NCHW, NCHW, 2e-5), Candidate(NHWC, NHWC, 1e-5)]
             if isinstance(s, TaskStep) else [] for s in part.steps]
    asked = []

    def transform_s(shape, src, dst):
        asked.append((shape, src, dst))
        return 1e-6
    plan, chosen = choose_layouts(part, cands, "ilp", transform_s, 20.0)
    assert sorted(asked) == [((1, 16, 8, 8), NCHW, NHWC), ((1, 16, 8, 8), NHWC, NCHW)]
    assert [c.out_layout for c in chosen] == [NHWC] * 3


class CheapTransforms(EmulatorDevice):
    transform_s = 1e-9  # per float: 1.2 us for the input, 0.6 us for the pooled value

    @classmethod
    def transform_seconds(cls, shape, src, dst):
        return cls.transform_s * math.prod(shape)


class DearTransforms(CheapTransforms):
    transform_s = 1e-7  # per float: 115 us for the input


@pytest.fixture(scope="module")
def both_layouts(case):
    """Records in both layouts: NHWC conv 4x faster than NCHW, pools about equal."""
    model, inputs, _ = case
    fast = {"conv2d": 1e-5, "max_pool2d": 1e-5}
    slow = {"conv2d": 4e-5, "max_pool2d": 1.2e-5}
    return (cuda_records_for(model, inputs, layout=NHWC, times=fast, seed=1)
            + cuda_records_for(model, inputs, layout=NCHW, times=slow, seed=2))


def test_the_layout_ilp_weighs_kernels_against_transforms(case, both_layouts):
    model, inputs, _ = case
    cheap = compile_network_cuda(model, inputs, both_layouts, TARGET, device=CheapTransforms)
    assert _steps(cheap) == [  # NHWC from the input to the pool: transforms are cheap
        ("input_1: NCHW -> NHWC", "transform", NHWC), ("0", "kernel", NHWC),
        ("2", "kernel", NHWC), ("_2: NHWC -> NCHW", "transform", NCHW),
        ("4", "kernel", NCHW)]
    plan = cheap.plan.layout_plan
    assert plan.cost == pytest.approx(1e-9 * (2 * 16 * 36 + 2 * 32 * 9) + 3 * 1.05e-5)
    assert "kernels writing 1 NCHW, 2 NHWC" in cheap.plan.summary()
    dear = compile_network_cuda(model, inputs, both_layouts, TARGET, device=DearTransforms)
    assert _steps(dear) == [("0", "kernel", NCHW), ("2", "kernel", NCHW),
                            ("4", "kernel", NCHW)]  # 115 us to transform beats 30 us saved
    assert dear.plan.layout_plan.cost == pytest.approx(1.05 * (4e-5 + 1.2e-5 + 1e-5))
    # the network's estimate is the tuner's: each task's best record, whatever its layout
    assert dear.estimated_s == pytest.approx(3 * 1.05e-5) == cheap.estimated_s


def test_uniform_keeps_one_layout_where_it_can(case, both_layouts):
    model, inputs, _ = case
    net = compile_network_cuda(model, inputs, both_layouts, TARGET, layout="uniform",
                               device=DearTransforms)
    assert [lay for _, _, lay in _steps(net)] == [NCHW] * 3
    with pytest.raises(CompileError, match="layout must be 'ilp' or 'uniform'"):
        compile_network_cuda(model, inputs, both_layouts, TARGET, layout="NHWC",
                             device=DearTransforms)


class FastTorchPool(EmulatorDevice):
    @classmethod
    def torch_seconds(cls, compute):
        return 1e-6 if compute.op == "max_pool2d" else 1.0


def test_fallback_torch_runs_a_step_where_torch_is_faster(case):
    model, inputs, records = case
    net = compile_network_cuda(model, inputs, records, TARGET, fallback="torch",
                               device=FastTorchPool)
    assert [(s.name, s.kind) for s in net.steps] == [("0", "kernel"), ("2", "torch"),
                                                      ("4", "kernel")]
    assert net.steps[1].estimate == 1e-6


@pytest.mark.skipif(_has_gpu(), reason="a GPU names the arch of a plain 'cuda' target")
def test_a_plain_cuda_target_needs_an_arch_without_a_gpu(case):
    model, inputs, records = case
    with pytest.raises(CompileError, match="needs a visible GPU"):
        rk.compile_network(model, inputs, records, target="cuda")


@pytest.fixture(scope="module")
def gpu_arch():
    pytest.importorskip("cupy")
    if not _has_gpu() or not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to cupy and torch")
    from raytune_kernels.cuda.device import device_arch
    return device_arch()


def test_on_the_gpu_the_network_equals_the_model_and_benchmarks(gpu_arch):
    model, inputs = tiny()
    records = cuda_records_for(model, inputs, arch=gpu_arch)
    net = rk.compile_network(model, inputs, records, target=f"cuda -arch={gpu_arch}")
    x = torch.randn(2, 16, 6, 6)
    with torch.no_grad():
        want = model(x)
    got = net(x.cuda())
    assert got.is_cuda and torch.allclose(got.cpu(), want, atol=1e-4, rtol=1e-4)
    assert torch.allclose(net(x), want, atol=1e-4, rtol=1e-4)  # CPU in, CPU out
    seconds = net.benchmark()
    assert 0 < seconds < 0.1


def test_on_the_gpu_fallback_torch_runs_on_device_tensors(gpu_arch):
    model, inputs = tiny()
    records = cuda_records_for(model, inputs, arch=gpu_arch, skip=("max_pool2d",))
    net = rk.compile_network(model, inputs, records, target=f"cuda -arch={gpu_arch}",
                             fallback="torch")
    assert "torch" in [s.kind for s in net.steps]
    x = torch.randn(2, 16, 6, 6)
    with torch.no_grad():
        assert torch.allclose(net(x.cuda()).cpu(), model(x), atol=1e-4, rtol=1e-4)


def test_a_layout_change_of_the_same_bytes_copies_nothing():
    """After a global pool, NHWC and NCHW hold the same order: flatten reads the pooled
    NHWC value in place (an alias), no transform step."""
    assert same_order((2, 32, 1, 1), NHWC, NCHW) and same_order((2, 1, 5, 5), NCHW, NHWC)
    assert not same_order((2, 32, 2, 1), NHWC, NCHW)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 32)).eval()
    inputs = (torch.randn(2, 8, 5, 5),)
    records = cuda_records_for(model, inputs, layout=NHWC)
    net = compile_network_cuda(model, inputs, records, TARGET, device=CheapTransforms)
    assert _steps(net) == [("input_1: NCHW -> NHWC", "transform", NHWC), ("0", "kernel", NHWC),
                           ("1", "kernel", NHWC), ("3", "kernel", NCHW)]
    assert net.steps[3].reads[0].root is net.steps[2].out  # flatten: a view of a relabel


@pytest.fixture(scope="module")
def resnet18_both(zoo_models):
    """ResNet-18's records in both layouts: NHWC kernels 2x faster than NCHW ones."""
    model, inputs = zoo_models["resnet18"]
    times = {op: 1e-5 for op in ("conv2d", "max_pool2d", "adaptive_avg_pool2d")}
    slow = {op: 2e-5 for op in times}
    return model, inputs, (cuda_records_for(model, inputs, layout=NHWC, times=times, seed=3)
                           + cuda_records_for(model, inputs, layout=NCHW, times=slow, seed=4))


def test_resnet18_is_planned_in_one_layout_with_transforms_only_at_its_ends(resnet18_both):
    """A whole network through the layout ILP and the planner (every kernel built by NVRTC,
    nothing run): with NHWC kernels faster and transforms cheap, the one transform is
    the input's; the residual adds read NHWC; the pooled 512x1x1 value is relabelled for
    flatten; with transforms dear, it stays NCHW and has none."""
    model, inputs, records = resnet18_both
    net = compile_network_cuda(model, inputs, records, TARGET, device=CheapTransforms,
                               check=False)
    transforms = [s.name for s in net.steps if s.kind == "transform"]
    assert transforms == ["x: NCHW -> NHWC"]
    kernels = [s for s in net.steps if s.kind == "kernel"]
    n_tasks = sum(isinstance(s, TaskStep) for s in net.part.steps)
    assert len(kernels) == n_tasks == 23 and all(s.out.layout == NHWC for s in kernels[:-1])
    assert all(r.layout == NHWC for s in kernels[:-1] for r in s.reads)
    assert kernels[-1].out.layout == NCHW  # the dense
    dear = compile_network_cuda(model, inputs, records, TARGET, device=DearTransforms,
                                check=False)
    assert [s.kind for s in dear.steps] == ["kernel"] * 23
    assert all(s.out.layout == NCHW for s in dear.steps)
    assert dear.plan.layout_plan.cost > net.plan.layout_plan.cost


def test_a_saved_gpu_network_loads_and_runs_the_same(case, net, tmp_path):
    from raytune_kernels.compile.api import load
    from raytune_kernels.compile.artifact import read

    path = str(tmp_path / "tiny.rkn")
    net.save(path)
    assert read(path)[0]["machine"] == {"kind": "cuda", "arch": ARCH}
    back = load(path, device=EmulatorDevice)
    assert back.graph == net.graph and back.device.captures == int(net.graph)
    assert [s.binary for s in back.steps] == [s.binary for s in net.steps]
    x = net.random_inputs(seed=2)
    assert torch.equal(back(*x), net(*x))
