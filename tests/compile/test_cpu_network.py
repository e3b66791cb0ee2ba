"""compile_network() for real: records measured here, kernels built, the network checked."""
import dataclasses
import math
import random
import warnings

import numpy as np
import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.cpu.runner import Runner
from raytune_kernels.cpu.schedules import lower, space_for
from raytune_kernels.space import Config
from raytune_kernels.cpu.measure import measure_built
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.compile.api import compile_network
from raytune_kernels.compile.cpu_network import check_network
from raytune_kernels.compile.cpu_plan import Buf
from raytune_kernels.errors import CompileError
from raytune_kernels.layout.costs import layouts_of
from raytune_kernels.tune.records import RecordWriter, record_of
from tests.support.nets import before_knob

QUICK = MeasureOptions(threads=1, min_repeat_ms=1, repeats=3)


class Small(torch.nn.Module):
    """Conv+BN+ReLU, max pool, a residual block, global pool, a dense layer whose 10
    outputs do not fill a vector block (its output is padded inside the kernel)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(16, 16, 1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn1(self.conv1(x))))
        z = torch.relu(self.conv3(torch.relu(self.conv2(y))) + y)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(z, 1), 1))


def _direct_in(task, cfg, layout: str) -> bool:
    """A direct config that reads and writes `layout` ("nhwc": NHWC in and out; "blocked":
    NCHW<x>c out). An NHWC output alone is not enough: a 1x1 conv may read its input
    blocked (cb < C) and write NHWC, and a plan of NHWC steps needs both sides."""
    if cfg.get("out_layout") != layout or cfg.get("algorithm", "direct") != "direct":
        return False
    src, _ = layouts_of(task, cfg)
    return layout != "nhwc" or src.startswith("NHWC")


def measured_records(model, inputs, per_task=5, threads=1, skip=(), seed=0, layouts=()):
    """A few random configs of every task, really built and measured; with `layouts`, also
    a direct config of each of these out_layouts wherever the task's space has one (what
    random draws hold depends on the CPU's vector width)."""
    cpu, rng, out = cpu_info(), random.Random(seed), []
    opts = MeasureOptions(threads=threads, min_repeat_ms=1, repeats=3)
    for task in rk.extract_tasks(model, inputs):
        if task.compute.op in skip:
            continue
        space = space_for(task.compute, cpu)
        configs = {space.sample(rng) for _ in range(per_task)}
        for layout in layouts:
            if not any(_direct_in(task, c, layout) for c in configs):
                found = next((c for c in (space.sample(rng) for _ in range(400))
                              if _direct_in(task, c, layout)), None)
                configs |= {found} - {None}
        for cfg in configs:
            built = build_for(task.compute, cfg)
            result = measure_built(task.compute, cfg, built.library, opts, built.seconds) \
                if built.library else None
            if result is not None:
                out.append(record_of(task.key, "llvm", cpu.name, cfg.to_json(), result,
                                     threads))
    return out


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    model = Small().eval()
    with torch.no_grad():  # give batch norm non-trivial statistics
        model.bn1.running_mean.uniform_(-0.5, 0.5)
        model.bn1.running_var.uniform_(0.5, 2.0)
    inputs = (torch.randn(1, 3, 16, 16),)
    return model, inputs, measured_records(model, inputs)


@pytest.fixture(scope="module")
def net(small):
    model, inputs, records = small
    return compile_network(model, inputs, records)


def test_compiled_network_equals_the_model_on_new_inputs(small, net):
    model, _, _ = small
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)
    kinds = {s.kind for s in net.steps}
    assert "kernel" in kinds and "torch" not in kinds
    assert "glue" not in kinds  # flatten and the padded dense output are views, not copies


def test_the_native_steps_run_in_one_native_call_and_match_step_by_step(small, net):
    model, _, _ = small
    assert all(s.kernel is not None for s in net.steps)
    assert len(net._segments) == 1 and isinstance(net._segments[0][0], Runner)
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        whole = net(x).clone()
        net._in_views[0].copy_(x)
        for fn, args in net._calls:  # the same steps, one ctypes call each
            fn(*args)
        assert torch.equal(net._out_views[0], whole)


def test_an_input_is_read_where_the_callers_tensor_lies(small, net):
    """The native calls read a contiguous, aligned float32 input in the caller's tensor:
    the network's own buffer of it is left as it was (NaN here), the caller's tensor
    unchanged, the runner's table back at its own buffer after the call. An input laid
    out otherwise (channels last, another dtype, not 64-byte aligned) is copied in and
    gives the same outputs."""
    model, _, _ = small
    slots, own = net._in_slots[0], net._in_views[0]
    assert slots and all(rest == own.data_ptr() for _, rest in slots)
    x = torch.randn(1, 3, 16, 16)
    kept = x.clone()
    own.fill_(float("nan"))
    with torch.no_grad():
        got = net(x)
        assert torch.allclose(got, model(x), atol=1e-4, rtol=1e-4)
    assert torch.isnan(own).all() and torch.equal(x, kept)
    assert all(word.value == rest for word, rest in slots)
    unaligned = torch.empty(x.numel() + 1)[1:].view_as(x).copy_(x)
    for y in (x.to(memory_format=torch.channels_last), x.double(), unaligned):
        own.fill_(float("nan"))
        assert torch.equal(net(y), got)
        assert torch.equal(own, x)


def test_an_input_a_pytorch_step_reads_is_copied_in(small):
    """conv1 left to PyTorch reads the network's own buffer of the input: no native call
    is handed the caller's tensor."""
    model, inputs, records = small
    conv1 = next(t for t in rk.extract_tasks(model, inputs) if "conv1" in t.layers)
    slow = [dataclasses.replace(r, times=(1.0, 1.0, 1.0)) if r.task_key == conv1.key else r
            for r in records]
    net = compile_network(model, inputs, slow, fallback="torch")
    assert net.steps[0].kernel is None and net._in_slots[0] is None
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


def test_pytorch_steps_split_the_native_runs(small):
    """A step left to PyTorch (fallback="torch", its kernel recorded slower than PyTorch)
    in the middle of the network: the kernels before and after it run as native runs of
    their own, in order, and the network still matches the model."""
    model, inputs, records = small
    conv2 = next(t for t in rk.extract_tasks(model, inputs) if "conv2" in t.layers)
    slow = [dataclasses.replace(r, times=(1.0, 1.0, 1.0)) if r.task_key == conv2.key else r
            for r in records]
    net = compile_network(model, inputs, slow, fallback="torch")
    native = [s.kernel is not None for s in net.steps]
    assert native.count(False) >= 1 and native[0] and native[-1]
    # what runs, in order: each step's border fills (native) and the step itself
    want = [k for i, n in enumerate(native) for k in [True] * len(net._fills.get(i, ())) + [n]]
    order = []
    for fn, _ in net._segments:
        order += [True] * len(fn.kernels) if isinstance(fn, Runner) else \
            [not any(fn is b[0] for b, s in zip(net._bound, net.steps) if s.kernel is None)]
    assert order == want
    assert sum(isinstance(fn, Runner) for fn, _ in net._segments) >= 2
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


def test_bordered_buffers_share_memory_and_get_their_border_written_again(small):
    """A windowed kernel's bordered input shares its memory with values of other
    geometries (one arena for all), so its border is written again before its writer runs:
    the network matches the model call after call, and without those refills it would
    not (another value overwrote the border). Untuned, so the plan is the same on every
    run of this CPU."""
    model, inputs, _ = small
    with pytest.warns(UserWarning, match="no record"):
        net = compile_network(model, inputs)
    assert net._fills
    from raytune_kernels.compile.cpu_plan import _geometry
    written = [b for s in net.steps for b in s.writes]
    assert any(b.bordered and _overlap(net, b, x) and _geometry(x) != _geometry(b)
               for b in written for x in written)
    with torch.no_grad():
        for scale in (1.0, 3.0, -2.0):
            x = torch.randn(1, 3, 16, 16) * scale + 1
            assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)
        for _ in range(2):  # the steps alone, no refills: the borders hold other values
            for fn, args in net._bound:
                fn(*args)
        net._in_views[0].copy_(x)
        for fn, args in net._bound:
            fn(*args)
        assert not torch.allclose(net._out_views[0], model(x), atol=1e-4, rtol=1e-4)


class Block(torch.nn.Module):
    """A residual block: y is read by conv1 (with its padding as a border) and by conv2's
    residual add."""

    def __init__(self):
        super().__init__()
        self.conv0 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.conv1 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv0(x))
        return torch.relu(self.conv2(torch.relu(self.conv1(y))) + y)


def test_a_residual_is_read_where_its_producer_wrote_the_next_convs_border():
    """Every conv reads and writes NHWC (one direct record each): y's producer writes it
    into conv1's bordered buffer and conv2 reads its residual from there (res_pad), so no
    transform copies y; the network still matches the model."""
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 16, 10, 12)
    cpu, rng, records = cpu_info(), random.Random(0), []
    for task in rk.extract_tasks(model, (x,)):
        space = space_for(task.compute, cpu)
        cfg = next(c for c in (space.sample(rng) for _ in range(2000))
                   if _direct_in(task, c, "nhwc"))
        built = build_for(task.compute, cfg)
        records.append(record_of(task.key, "llvm", cpu.name, cfg.to_json(),
                                 measure_built(task.compute, cfg, built.library, QUICK,
                                               built.seconds), 1))
    net = compile_network(model, (x,), records)  # checked against the model
    convs = {s.name: s for s in net.steps if s.kind == "kernel"}
    y = convs["conv0"].writes[0]
    assert y.bordered and y.layout.label == "NHWC/p1x1"
    assert y in convs["conv1"].reads and y in convs["conv2"].reads
    assert not any(y in s.reads for s in net.steps if s.kind == "transform")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 16, 10, 12)
            assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


def _span(net, b: Buf) -> tuple[int, int]:
    """The bytes a buffer's values occupy."""
    start = net._arrays[id(b)].ctypes.data
    return start, start + 4 * b.size


def _overlap(net, a: Buf, b: Buf) -> bool:
    (a0, a1), (b0, b1) = _span(net, a), _span(net, b)
    return a0 < b1 and b0 < a1


def test_buffers_are_reused_and_weights_packed_once(net):
    written = {id(b): b for s in net.steps for b in s.writes}.values()
    spans = sorted(_span(net, b) for b in written)
    used, reach = 0, 0
    for lo, hi in spans:  # bytes under some buffer, overlaps counted once
        used += max(0, hi - max(lo, reach))
        reach = max(reach, hi)
    assert used < sum(hi - lo for lo, hi in spans)  # dead values' memory reused
    x = torch.randn(1, 3, 16, 16)
    first, second = net(x), net(x)
    assert torch.equal(first, second)  # no state leaks from one call to the next


def test_a_task_without_records_runs_untuned_or_torch(small):
    model, inputs, records = small
    dense = next(t for t in rk.extract_tasks(model, inputs) if t.compute.op == "dense")
    partial = [r for r in records if r.task_key != dense.key]
    with pytest.warns(UserWarning, match=r"1 task\(s\) have no record .* dense 1x16"):
        untuned = compile_network(model, inputs, partial)
    assert [s.name for s in untuned.steps if s.kind == "torch"] == []
    assert "fc" in [s.name for s in untuned.steps if s.kind == "kernel"]
    net = compile_network(model, inputs, partial, fallback="torch")
    assert [s.name for s in net.steps if s.kind == "torch"] == ["fc"]
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


def test_fallback_uses_torch_where_the_tuned_kernel_is_slower(small):
    model, inputs, records = small
    conv2 = next(t for t in rk.extract_tasks(model, inputs) if "conv2" in t.layers)
    slow = [r if r.task_key != conv2.key else
            type(r)(**{**r.__dict__, "times": (1.0, 1.0, 1.0)}) for r in records]
    net = compile_network(model, inputs, slow, fallback="torch")
    assert "conv2" in [s.name for s in net.steps if s.kind == "torch"]
    assert any(s.kind == "kernel" for s in net.steps)


def test_records_at_another_thread_count_do_not_count(small):
    model, inputs, records = small
    with pytest.warns(UserWarning, match="have no record at 2 thread"):
        compile_network(model, inputs, records, threads=2)
    with pytest.raises(CompileError, match="does not exist"):
        compile_network(model, inputs, "/nonexistent/records.jsonl")


def test_records_of_another_cpu_are_skipped_or_refused_by_name(small, tmp_path):
    model, inputs, records = small
    foreign = [dataclasses.replace(r, device="znver9") for r in records]
    path = str(tmp_path / "elsewhere.jsonl")
    with RecordWriter(path) as w:
        w.write_batch(foreign)
    with pytest.raises(CompileError, match=rf"records file '{path}' holds no record of target "
                                           rf"'llvm' at 1 thread.*it holds {len(foreign)} of "
                                           rf"znver9: tune on this machine"):
        compile_network(model, inputs, path)
    with pytest.warns(UserWarning, match=f"the records given: skipped {len(foreign)} record"):
        net = compile_network(model, inputs, records + foreign)
    assert net.plan is not None


def test_a_record_of_an_older_schedule_space_is_skipped_with_a_warning(small):
    model, inputs, records = small
    stale = dataclasses.replace(records[0], config={"tile_w": 4}, times=(1e-9,))
    with pytest.warns(UserWarning, match=r"skipped 1 record\(s\) whose config is not in "
                                         r"today's schedule space.*'tile_w': 4"):
        net = compile_network(model, inputs, [stale] + records)
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


def test_untuned_kernels_are_checked_in_a_child_before_this_process_runs_them(small,
                                                                           monkeypatch):
    """No record: the estimate's configs run only after an isolated check; a task whose
    every untuned kernel fails it runs PyTorch's kernel, named with the failure."""
    from raytune_kernels.cpu import probe

    model, inputs, _ = small
    asked = []

    def failing(items, mcpu=None, threads=1, child=None):
        if child is not None:  # the check child compile_network started ahead
            child.kill()
            child.communicate()
        asked.extend(items)
        return ["crashed: killed its process by SIGSEGV"] * len(items)
    monkeypatch.setattr(probe, "check_isolated", failing)
    with pytest.warns(UserWarning, match=r"failed their isolated check: .*\(crashed: killed "
                                         r"its process by SIGSEGV\)"):
        net = compile_network(model, inputs, None)
    assert asked and {s.kind for s in net.steps} <= {"torch", "glue", "transform"}
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


def test_uniform_layout_baseline_compiles_and_is_correct(small, net):
    model, inputs, records = small
    uni = compile_network(model, inputs, records, layout="uniform")
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(uni(x), model(x), atol=1e-4, rtol=1e-4)
    assert net.plan.cost <= uni.plan.cost + 1e-12  # the ILP's optimum is never worse


def test_bad_input_shape_is_named(net):
    with pytest.raises(ValueError, match=r"shape \(1, 3, 8, 8\), compiled for \(1, 3, 16, 16\)"):
        net(torch.randn(1, 3, 8, 8))


def test_a_wrong_kernel_is_caught_and_located(small):
    model, inputs, records = small
    net = compile_network(model, inputs, records)
    step = next(s for s in net.steps if s.name == "conv2")
    weights = next(o for o in step.operands if isinstance(o, np.ndarray) and o.size > 16)
    weights *= 2.0  # sabotage the packed weights in place
    with pytest.raises(CompileError, match="first divergence at step conv2"):
        check_network(net, model, inputs, 1e-3)


def test_profile_table_chart_and_fidelity(net, tmp_path, capsys):
    png = str(tmp_path / "profile.png")
    prof = net.profile(png=png)
    assert len(prof.rows) == len(net.steps) and all(r.ours_s > 0 for r in prof.rows)
    # every step is clocked as its segment of the network runs it, in order
    assert [i for owners in net._owners for i in owners] == sorted(
        i for owners in net._owners for i in owners)
    assert {i for owners in net._owners for i in owners} == set(range(len(net.steps)))
    kernels = [r for r in prof.rows if r.kind == "kernel"]
    assert all(r.torch_s and r.torch_s > 0 for r in kernels)
    # each kernel's rate, from its layer's operations, against the machine model's peak
    machine = cpu_info().machine
    assert prof.peak_flops == pytest.approx(max(u.fma_per_cycle * u.lanes * 2
                                                for u in machine.units) * machine.ghz * 1e9)
    for r, s in zip(prof.rows, net.steps):
        assert r.flops == (net.part.task(s.key).compute.flops() if s.key else 0)
    conv = next(r for r in kernels if r.name == "conv2")
    assert conv.flops > 0 and conv.flops_per_s == pytest.approx(conv.flops / conv.ours_s)
    assert prof.peak_share(conv) == pytest.approx(conv.flops_per_s / prof.peak_flops)
    transform = next((r for r in prof.rows if r.kind == "transform"), None)
    assert transform is None or transform.flops_per_s is None
    out = capsys.readouterr().out
    assert "end to end" in out and "conv2" in out and "GFLOP/s" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("conv2 ")).split()
    rate_at = line.index(f"{conv.ours_s / prof.total_s:.1%}") + 1  # after the share
    assert line[rate_at:rate_at + 2] == [f"{conv.flops_per_s / 1e9:.1f}",
                                         f"{prof.peak_share(conv):.0%}"]
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    text = net.fidelity(prof.end_to_end_s, prof)
    assert text.startswith("estimated") and "measured" in text
    assert f"the layout plan expected {net.plan.cost * 1e3:.3f} ms" in text
    far = net.fidelity(net.estimated_s * 2, prof)
    assert "steps timed alone" in far


def test_a_step_alone_reads_its_weights_cold_as_records_are_timed(net):
    """profile()'s "alone": a conv's or dense's weights from copies that cycle, each the
    same bytes, so the step computes what it computes in the network; other steps as
    they are; cold_weights=False leaves the weights in place."""
    from raytune_kernels.cpu.measure import cold_copies

    net(*net._random_inputs())  # every buffer written
    i = next(i for i, s in enumerate(net.steps) if s.name == "conv2")
    weights = net.steps[i].operands[net.steps[i].weights]
    # the packed weights: a direct conv's 3x3 taps, or Winograd's 16 or 36 positions
    algorithm = net.steps[i].kernel.name.rsplit("_", 1)[-1]
    taps = {"winograd": 16, "winograd4": 36}.get(algorithm, 9)
    assert weights.size == net.part.task(net.steps[i].key).compute.inputs[1].numel * taps // 9
    out = net._arrays[id(net.steps[i].writes[0])]
    warm = net._alone(i, False)
    assert not hasattr(warm, "copies")
    warm()  # on whatever the network left in its input buffer (buffers are shared)
    want = out.copy()
    cold = net._alone(i, True)
    assert len(cold.copies) == cold_copies(weights.nbytes) >= 2
    assert all(c.ctypes.data != weights.ctypes.data and np.array_equal(c, weights)
               for c in cold.copies)
    for _ in range(len(cold.copies) + 1):  # every copy in turn
        out[:] = np.nan
        cold()
        np.testing.assert_array_equal(out, want)
    other = next(i for i, s in enumerate(net.steps) if s.kind != "kernel" or s.key is None
                 or net.part.task(s.key).compute.op not in ("conv2d", "dense"))
    assert not hasattr(net._alone(other, True), "copies")


def test_fidelity_times_our_steps_only(net, monkeypatch):
    """Explaining a gap needs our steps, never PyTorch's layers (a compile without
    --profile times no PyTorch layer) nor another end-to-end benchmark."""
    monkeypatch.setattr(net, "_clock_torch", pytest.fail)
    monkeypatch.setattr(net, "benchmark", pytest.fail)
    far = net.fidelity(net.estimated_s * 2)
    assert "steps timed alone" in far and "measured" in far


def test_machine_drift_is_the_median_of_recorded_kernels_alone_over_their_records():
    """Each kernel alone here over its record; rows whose estimate is no record's
    (transforms, untuned kernels) left out; one record far off moves nothing; nothing
    within the threshold."""
    from raytune_kernels.compile.report import ProfileRow, machine_drift

    def row(name, alone, record, kind="kernel", recorded=True):
        return ProfileRow(name, kind, (name,), alone, alone, None, record, recorded=recorded)
    rows = [row("a", 3e-3, 1e-3), row("b", 2e-3, 1e-3), row("c", 5e-3, 5e-3),
            row("far", 1e-4, 1e-2), row("t", 9e-3, 1e-6, kind="transform"),
            row("u", 9e-3, 1e-6, recorded=False)]
    drift = machine_drift(rows)
    assert drift.per_kernel == pytest.approx((0.01, 1.0, 2.0, 3.0))
    assert drift.ratio == pytest.approx(1.5)
    line = drift.line(estimated_s=8e-3, measured_s=15e-3)
    assert "slower" in line and "a median 1.50x its record (0.01-3.00x over 4 kernels)" in line
    assert "at this pace 12.000 ms, measured +25.0%" in line
    # as recorded but for one far-off record: no drift
    assert machine_drift([rows[2], row("d", 1.05e-3, 1e-3), rows[3]]) is None
    assert machine_drift([row("a", 1e-3, 1.1e-3)]) is None  # within 15%
    assert "faster" in machine_drift([row("a", 1e-3, 2e-3)]).line(2e-3, 1e-3)


def test_fidelity_names_a_machine_slower_than_the_records(small, tmp_path):
    """Records from a machine 5x faster than this one: the report says so and scales the
    estimate by it, rather than blaming the network; a saved network keeps which tasks
    were recorded."""
    model, inputs, records = small
    fast = [dataclasses.replace(r, times=tuple(t / 5 for t in r.times)) for r in records]
    net = compile_network(model, inputs, fast, refine=1)
    assert net.recorded == {r.task_key for r in records}
    text = net.fidelity(net.estimated_s * 5)
    assert "this machine runs the kernels slower than their records" in text, text
    path = str(tmp_path / "net.rkn")
    net.save(path)
    assert rk.load(path).recorded == net.recorded


def test_compile_command_checks_and_times_against_torch(small, tmp_path, capsys):
    from raytune_kernels.cli import main
    from raytune_kernels.tune.records import RecordWriter

    model, inputs, records = small
    path = tmp_path / "small.py"
    path.write_text("import torch\nfrom tests.compile.test_cpu_network import Small\n"
                    "def make():\n    torch.manual_seed(0)\n"
                    "    return Small().eval(), (torch.randn(1, 3, 16, 16),)\n")
    rec = str(tmp_path / "r.jsonl")
    with RecordWriter(rec) as w:
        w.write_batch(records)
    # a fresh Small(): batch norm keeps default statistics, same tasks except the folded conv1
    code = main(["compile", f"{path}:make", "--records", rec, "--fallback", "torch",
                 "--profile"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "checked against the model" in out and "PyTorch eager" in out
    # the fidelity report comes last: its first line the estimate, then (the gap decides
    # which) the layout plan's expectation or where a gap over 10% comes from
    report = out[out.index("\nestimated "):].strip().splitlines()
    assert "end to end" in report[0] and len(report) >= 2
    assert report[-1].startswith(("the layout plan expected", "steps timed alone"))
    assert main(["compile", f"{path}:make", "--records", str(tmp_path / "none.jsonl")]) == 2


def test_blocks_that_do_not_nest_go_through_their_common_block():
    from raytune_kernels.layout.costs import fastest_transform
    from raytune_kernels.compile.cpu_plan import transform_cost, via_layout

    assert via_layout("NCHW48c", "NCHW32c/p1x1") == "NCHW16c"
    assert via_layout("NCHW16c", "NCHW32c") is None and via_layout("NHWC", "NCHW8c") is None
    shape = (1, 96, 6, 6)
    assert fastest_transform(shape, "NCHW48c", "NCHW32c", QUICK)[1] is None
    assert 0 < transform_cost(shape, "NCHW48c", "NCHW32c/p1x1", QUICK) < 1e-2


def test_a_transformer_layer_compiles_with_row_kernels_and_glue(zoo_models):
    """Dense, batched matmul, softmax and layer norm kernels, with permutes run as glue:
    native copies, so that the whole layer is one native run, no PyTorch between: four,
    the keys' split into heads and transpose composed into one."""
    model, inputs = zoo_models["bert_layer"]
    net = compile_network(model, inputs, measured_records(model, inputs, per_task=2))
    kinds = {s.kind for s in net.steps}
    assert kinds == {"kernel", "glue"}
    glue = [s for s in net.steps if s.kind == "glue"]
    assert len(glue) == 4 and all(s.kernel is not None for s in glue)
    assert len(net._segments) == 1
    x = torch.randn_like(inputs[0])
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


class Concats(torch.nn.Module):
    """Two convs' outputs joined on channels (values: a native copy), then a constant
    joined on the last axis (a parameter operand: PyTorch's cat, into the buffer)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 1)
        self.c = torch.nn.Parameter(torch.randn(1, 24, 6, 2))

    def forward(self, x):
        y = torch.cat([torch.relu(self.a(x)), self.b(x)], 1)
        return torch.cat([y, self.c], 3)


def test_concats_of_values_are_native_copies_and_of_constants_pytorchs():
    torch.manual_seed(0)
    model, x = Concats().eval(), torch.randn(1, 8, 6, 6)
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, (x,), atol=1e-4)
    glue = [s for s in net.steps if s.kind == "glue"]
    assert [s.kernel is not None for s in glue] == [True, False]
    assert glue[1].into is not None  # PyTorch's cat writes into the output buffer
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


class Views(torch.nn.Module):
    """Glue whose results are views of a computed value (a slice, a select, an expand, a
    transpose: native copies) and one that is not (an index by a list: PyTorch's)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(12, 24)
        self.b = torch.nn.Linear(6, 6)

    def forward(self, x):
        y = self.a(x)  # (2, 5, 24)
        z = y[:, 1:4, ::4] + y[:, 0:1, 2:8].expand(2, 3, 6)
        w = self.b(z.transpose(1, 2).contiguous()[:, :, [0, 2, 1]].sum(-1, keepdim=True)
                   .expand(2, 6, 6))
        return w + y[:, 4, 1:7].unsqueeze(1)


def test_views_of_values_are_native_copies_and_fancy_indexes_pytorchs():
    torch.manual_seed(0)
    model, x = Views().eval(), torch.randn(2, 5, 12)
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, (x,), atol=1e-4)
    nodes = net.graph.node_map()
    native = {nodes[s.name].op for s in net.steps if s.kind == "glue" and s.kernel is not None}
    torch_glue = [nodes[s.name].op for s in net.steps if s.kind == "glue" and s.kernel is None]
    assert {"index", "expand", "permute"} <= native and torch_glue == ["index"]
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


def test_targets_and_options_are_checked_before_any_work(small):
    model, inputs, records = small
    with pytest.raises(rk.UnknownTargetError):
        compile_network(model, inputs, records, target="rocm")
    # llvm records are not cuda records: every task is untuned there (and without a GPU
    # here, the network cannot run)
    with pytest.warns(UserWarning, match=r"task\(s\) without a cuda record for sm_90"):
        try:
            compile_network(model, inputs, records, target="cuda -arch=sm_90")
        except CompileError as exc:
            assert "GPU" in str(exc) or "CUDA" in str(exc)
    with pytest.raises(CompileError, match="fallback must be None or 'torch'"):
        compile_network(model, inputs, records, fallback="onnx")
    with pytest.raises(CompileError, match="layout must be 'ilp' or 'uniform'"):
        compile_network(model, inputs, records, layout="nhwc")
    with pytest.raises(CompileError, match="-mcpu=znve4 is not a CPU LLVM knows .*znver4"):
        compile_network(model, inputs, records, target="llvm -mcpu=znve4")
    with pytest.raises(CompileError, match="threads must be a positive integer, got 0"):
        compile_network(model, inputs, records, threads=0)
    with pytest.raises(CompileError, match="time_limit_s must be > 0 and atol >= 0"):
        compile_network(model, inputs, records, atol=-1.0)


def test_winograd_workspaces_are_values_of_their_step():
    """Two Winograd convs of different sizes: each step's V and M are buffers it writes
    and no later step reads, held in arena memory apart from every buffer live while it
    runs, and the network still equals the model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU()).eval()
    inputs = (torch.randn(1, 16, 8, 8),)
    cpu, rng, records = cpu_info(), random.Random(0), []
    opts = MeasureOptions(threads=1, min_repeat_ms=1, repeats=3)
    for task in rk.extract_tasks(model, inputs):
        space = space_for(task.compute, cpu)
        part = dict(space.parts)["winograd"]
        cfg = space._tag("winograd", part.sample(rng))
        built = build_for(task.compute, cfg)
        result = measure_built(task.compute, cfg, built.library, opts, built.seconds)
        records.append(record_of(task.key, "llvm", cpu.name, cfg.to_json(), result))
    net = compile_network(model, inputs, records)  # checked against the model
    nests = {t.key: lower(t.compute, Config.from_json(r.config))
             for t, r in zip(rk.extract_tasks(model, inputs), records)}
    kernels = [s for s in net.steps if s.kind == "kernel"]
    assert len(kernels) == 2

    def span(b):
        a = net._arrays[id(b.root)]
        return a.ctypes.data, a.ctypes.data + 4 * b.size

    for s in kernels:
        names = [b.name for b in nests[s.key].buffers]
        work = [s.operands[names.index(n)] for n in ("v", "m")]
        assert s.writes[1:] == work and s.writes[0] is s.operands[names.index("out")]
        assert [w.size for w in work] == [nests[s.key].buffers[names.index(n)].size
                                          for n in ("v", "m")]
        later = net.steps[net.steps.index(s) + 1:]
        assert not any(w is b for w in work for t in later for b in t.reads + t.writes)
        live = [b for b in s.reads + s.writes if isinstance(b, Buf)]
        for w in work:  # apart from the step's inputs, its output and its other workspace
            lo, hi = span(w)
            assert all(hi <= span(b)[0] or span(b)[1] <= lo for b in live if b is not w)
    # alone, cold: the packed weights rotate, never a workspace
    for s in kernels:
        names = [b.name for b in nests[s.key].buffers]
        assert s.weights == names.index("b")
        cold = net._alone(net.steps.index(s), True)
        assert all(np.array_equal(c, s.operands[s.weights]) for c in cold.copies)


def test_the_check_is_relative_to_each_values_scale():
    from raytune_kernels.compile.report import scaled_error, worst

    big = torch.full((4,), 1e6)
    assert scaled_error(big + 10.0, big) == pytest.approx(1e-5)  # rounding at 1e6: passes
    tiny = torch.full((4,), 1e-4)
    assert scaled_error(tiny * 2, tiny) == pytest.approx(1.0)  # wrong, however small
    assert scaled_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert math.isnan(scaled_error(torch.tensor([math.nan]), torch.ones(1)))
    assert math.isnan(worst([0.1, math.nan])) and worst([0.1, 0.2]) == 0.2


class Loud(torch.nn.Module):
    """Activations of order 1e6 (an unnormalised stack of convolutions): float rounding
    alone gives absolute errors far above 1e-3 at the output."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.Sequential(*[torch.nn.Conv2d(16, 16, 3, padding=1)
                                           for _ in range(3)])

    def forward(self, x):
        return self.convs(x * 1e4)


def test_large_activations_are_not_refused_for_rounding():
    torch.manual_seed(0)
    model, x = Loud().eval(), torch.randn(1, 16, 8, 8)
    records = measured_records(model, (x,), per_task=2)
    net = compile_network(model, (x,), records)  # checks relative to the output's scale
    with torch.no_grad():
        want = model(x)
    abs_error = (net(x) - want).abs().max().item()
    assert abs_error > 1e-3  # an absolute limit of 1e-3 would have refused this network


class DictOut(torch.nn.Module):
    """Outputs in a dict, as Hugging Face's ModelOutput holds them (a pytree of tensors)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(x)
        return {"last_hidden_state": h, "pooled": torch.tanh(h[:, 0])}


def test_outputs_in_a_dict_are_checked_leaf_by_leaf():
    model, x = DictOut().eval(), torch.randn(1, 5, 16)
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, (x,))  # check=True compares every leaf
    got = net(x)
    assert isinstance(got, tuple) and len(got) == 2
    from raytune_kernels.compile.report import output_error
    with torch.no_grad():
        want = model(x)
        assert output_error(got, want) < 1e-5
        assert math.isnan(output_error(got[:1], want))  # outputs that do not line up
        bad = (got[0], got[1] + 1.0)
        assert output_error(bad, want) > 0.1


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.fc = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16)

    def forward(self, ids):
        return self.fc(self.emb(ids))


def test_token_id_inputs_are_timed_on_valid_ids():
    """benchmark() and profile() time on random inputs: random ids would index outside
    the table, so integer inputs are the example's own ids, shuffled."""
    from raytune_kernels.timing import TimingOptions
    ids = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(Embed().eval(), (ids,))
    (again,) = net._random_inputs(seed=1)
    assert sorted(again.flatten().tolist()) == sorted(ids.flatten().tolist())
    assert net.benchmark(TimingOptions(warmup=1, min_repeat_ms=1, repeats=3)) > 0
    prof = net.profile(runs=2, print_table=False)
    assert len(prof.rows) == len(net.steps)


def test_an_embedding_gathers_straight_into_its_buffer():
    """The embedding's rows go straight into the step's output buffer (no temporary of
    the output's size, faulted in afresh on every call); fresh ids give fresh rows."""
    from raytune_kernels.compile.step_fns import EmbeddingInto
    torch.manual_seed(0)
    model = Embed().eval()
    ids = torch.randint(0, 50, (1, 12))
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, (ids,))
    (step,) = [s for s in net.steps if s.name == "emb"]
    assert isinstance(step.into, EmbeddingInto) and step.kind == "glue"
    for seed in range(3):
        x = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            assert torch.allclose(net(x), model(x), atol=1e-5, rtol=1e-5)


class Inverted(torch.nn.Module):
    """MobileNetV2's block: 1x1 expand, depthwise 3x3, 1x1 project, residual."""

    def __init__(self, c=16, e=48):
        super().__init__()
        self.expand = torch.nn.Conv2d(c, e, 1)
        self.dw = torch.nn.Conv2d(e, e, 3, padding=1, groups=e)
        self.project = torch.nn.Conv2d(e, c, 1)

    def forward(self, x):
        y = torch.nn.functional.relu6(self.dw(torch.nn.functional.relu6(self.expand(x))))
        return self.project(y) + x


def test_depthwise_steps_in_nhwc_sit_between_nhwc_convs_without_a_layout_change():
    """Records that make NHWC the cheapest layout for every step: the plan keeps the
    block in NHWC, the expand conv writes straight into the depthwise conv's bordered
    buffer (no copy adds the border), and the network matches the model. An older
    depthwise record without the out_layout knob is still read (as the blocked kernel it
    was)."""
    torch.manual_seed(0)
    model, inputs = Inverted().eval(), (torch.randn(1, 16, 12, 12),)
    records = [r for r in measured_records(model, inputs, per_task=6, seed=1,
                                           layouts=("nhwc", "blocked"))
               if r.config.get("algorithm", "direct") == "direct"]
    nhwc = [dataclasses.replace(r, times=tuple(t / 10 for t in r.times)) for r in records
            if r.config.get("out_layout") == "nhwc"]
    dw_key = next(t.key for t in rk.extract_tasks(model, inputs) if t.compute.attr("groups"))
    assert dw_key in {r.task_key for r in nhwc}
    old = [dataclasses.replace(r, config={k: v for k, v in r.config.items()
                                          if k != "out_layout"})
           for r in records if r.task_key == dw_key and r.config["out_layout"] == "blocked"]
    assert old
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nothing skipped as stale
        net = compile_network(model, inputs, records + nhwc + old)
    x = torch.randn(1, 16, 12, 12)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)
        assert torch.allclose(net(x + 1), model(x + 1), atol=1e-4, rtol=1e-4)  # border kept
    moves = sorted(s.name.split(": ")[1] for s in net.steps if s.kind == "transform")
    assert moves == ["NCHW -> NHWC", "NHWC -> NCHW"], moves  # into and out of the network
    expand = next(s for s in net.steps if s.name == "expand")
    assert expand.writes[0].layout.label == "NHWC/p1x1"


def test_a_task_tuned_only_before_a_knob_existed_is_named_in_a_warning():
    """Records that all predate the out_layout knob of the depthwise task still compile
    (as the blocked kernels they were), and one warning names that task and the knob:
    its NHWC kernels were never tuned, so the plan could not choose them."""
    torch.manual_seed(0)
    model, inputs = Inverted().eval(), (torch.randn(1, 16, 12, 12),)
    records = [r for r in measured_records(model, inputs, per_task=4, seed=1,
                                           layouts=("blocked",))
               if r.config.get("algorithm", "direct") == "direct"]
    dw = next(t for t in rk.extract_tasks(model, inputs) if t.compute.attr("groups"))
    old = [before_knob(r) if r.task_key == dw.key else r
           for r in records if r.task_key != dw.key or r.config["out_layout"] == "blocked"]
    assert any(r.task_key == dw.key for r in old)
    with pytest.warns(UserWarning, match=rf"1 task\(s\) hold only records written before "
                                         rf"the knob\(s\) out_layout.*task {dw.key}"):
        net = compile_network(model, inputs, old)
    x = torch.randn(1, 16, 12, 12)
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)


def test_allocate_places_values_in_one_arena_and_names_the_borders_to_write_again():
    """Values whose lives do not overlap share arena memory, in part where sizes differ
    (largest first, each at the lowest free offset); a bordered value over memory another
    value writes gets its border written again on every run, up to where the other
    reaches; one whose memory nothing else takes is made with its border."""
    from raytune_kernels.compile.cpu_plan import Step, allocate
    from raytune_kernels.cpu.transform import Layout
    plain = Buf(200, (1, 2, 10, 10))
    small_plain = Buf(10, (1, 10, 1, 1))
    bordered = Buf(200, (1, 2, 8, 8), Layout("NCHW", (1, 1)), border=-1.0)
    again = Buf(200, (1, 2, 8, 8), Layout("NCHW", (1, 1)), border=-1.0)
    solo = Buf(72, (1, 2, 6, 6), Layout("NCHW", (1, 1)), border=2.0)
    out = Buf(10, (1, 10, 1, 1), pinned=True)
    steps = [Step("a", "kernel", (), [], [plain, solo]),
             Step("b", "kernel", (), [plain], [small_plain]),
             Step("c", "kernel", (), [small_plain], [bordered]),
             Step("d", "kernel", (), [bordered], [again]),
             Step("e", "kernel", (), [again, solo], [out])]
    arrays, refill = allocate(steps, [out])
    bufs = (plain, small_plain, bordered, again, solo)
    at = {id(b): (arrays[id(b)].ctypes.data - arrays[id(plain)].ctypes.data) // 4
          for b in bufs}
    assert at[id(bordered)] == 0  # the dead plain value's memory
    assert at[id(again)] == 208  # apart from bordered (both live at d), on a cache line
    assert at[id(solo)] == 416  # alive throughout: apart from every other value
    assert at[id(small_plain)] == 208  # alive at b and c only: in again's memory
    assert refill == [(bordered, 200), (again, 10)]
    assert (arrays[id(solo)] == 2.0).all()  # made with its border, never overwritten
    lives = {id(plain): (0, 1), id(small_plain): (1, 2), id(bordered): (2, 3),
             id(again): (3, 4), id(solo): (0, 4)}
    for a in bufs:
        for b in bufs:
            if a is not b and lives[id(a)][0] <= lives[id(b)][1] and \
                    lives[id(b)][0] <= lives[id(a)][1]:
                assert at[id(a)] + a.size <= at[id(b)] or at[id(b)] + b.size <= at[id(a)]
    o = arrays[id(out)].ctypes.data  # the graph's output: memory of its own
    assert all(not (arrays[id(b)].ctypes.data <= o < arrays[id(b)].ctypes.data + 4 * b.size)
               for b in bufs)


def test_no_two_values_alive_together_share_memory(net):
    """In a compiled network, every pair of buffers alive at a common step (written then,
    or read later) occupies disjoint memory."""
    life = {}
    for i, s in enumerate(net.steps):
        for b in s.writes:
            life.setdefault(id(b.root), [i, i])
        for b in s.reads + s.writes:
            if id(b.root) in life:
                life[id(b.root)][1] = i
    roots = {id(b.root): b.root for s in net.steps for b in s.writes}
    for a in roots.values():
        for b in roots.values():
            (a0, a1), (b0, b1) = life[id(a)], life[id(b)]
            if a is not b and a0 <= b1 and b0 <= a1:
                assert not _overlap(net, a, b), (a, b)


def test_a_compile_that_raises_leaves_no_check_child_behind(monkeypatch):
    from raytune_kernels.compile import cpu_network

    class Child:  # stands for the check child an untuned compile starts ahead
        killed = reaped = False

        def kill(self):
            self.killed = True

        def communicate(self):
            self.reaped = True
    child = Child()
    monkeypatch.setattr(cpu_network, "start_child", lambda target: child)

    def refuse(model, inputs):
        raise CompileError("capture refused")
    monkeypatch.setattr(cpu_network, "capture", refuse)
    with pytest.raises(CompileError, match="capture refused"):
        compile_network(torch.nn.Linear(4, 4), torch.randn(1, 4))
    assert child.killed and child.reaped


def test_untuned_candidates_are_priced_at_the_compile_threads():
    """An untuned 12x128x128 softmax at 2 threads runs its rows in parallel, estimated at
    about half its time at 1 thread (the estimate found serial and parallel rows equal)."""
    from raytune_kernels.compile.cpu_network import estimated_candidates
    from raytune_kernels.frontend.partition import TaskStep, partition

    part = partition(rk.capture(torch.nn.Softmax(-1), (torch.randn(1, 12, 128, 128),)))
    (step,) = [s for s in part.steps if isinstance(s, TaskStep)]
    picks = {t: min(estimated_candidates(part, step, cpu_info(), t), key=lambda c: c.seconds)
             for t in (1, 2)}
    assert picks[2].config["parallel"] and picks[2].seconds < 0.6 * picks[1].seconds


def test_a_copy_splits_channel_blocks_only_where_its_kernels_do(monkeypatch):
    """A transform's threads take channel blocks where more of the value's producer and
    reader split channel blocks (ko) than rows (oh), and bands of rows otherwise."""
    from raytune_kernels.compile import cpu_plan
    from raytune_kernels.frontend.partition import partition
    from raytune_kernels.layout.graph import Candidate

    torch.manual_seed(0)
    model, x = torch.nn.Conv2d(8, 64, 1).eval(), torch.randn(1, 8, 32, 32)
    part = partition(rk.capture(model, (x,)))
    step, = part.steps
    asked = []
    real = cpu_plan.transform_kernel
    monkeypatch.setattr(cpu_plan, "transform_kernel",
                        lambda shape, s, d, cfg: asked.append(cfg) or real(shape, s, d, cfg))
    space, rng = space_for(part.task(step.key).compute, cpu_info()), random.Random(0)
    for first in ("oh", "ko"):
        cfg = next(c for c in (space.sample(rng) for _ in range(5000))
                   if c.get("algorithm", "direct") == "direct" and
                   c["spatial_order"][0] == first and
                   layouts_of(part.task(step.key), c)[1] == "NHWC")
        planner = cpu_plan.Planner(part, None, MeasureOptions(threads=2), priced_at=3.0)
        planner.task(step, Candidate(*layouts_of(part.task(step.key), cfg), 1e-5, cfg))
        assert planner.split_of[step.output] == first
        for reader, label in ((None, "NCHW16c"), ("oh", "NCHW8c"), ("ko", "NCHW32c")):
            asked.clear()
            planner.value(step.output, label, reader=reader)
            assert len(asked) == 1 and asked[0]["parallel"]  # 64 x 32 x 32: parallel
            assert asked[0]["rows_first"] == cpu_plan.copies_by_rows(first, reader)
    by_rows = cpu_plan.copies_by_rows
    assert by_rows(None, None) and by_rows("ow", "pt") and by_rows("oh", None)
    assert by_rows("ko", "oh") and by_rows("oh", "ko")  # a tie: rows
    assert not by_rows("ko", None) and not by_rows(None, "ko") and not by_rows("ko", "ko")


class Fork(torch.nn.Module):
    """A value read by a padded 3x3 conv and by a 1x1 conv."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 16, 3, padding=1)
        self.c = torch.nn.Conv2d(32, 16, 1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        return torch.relu(self.b(y)) * self.c(y)


def test_a_1x1_conv_reads_inside_the_border_its_sibling_wants():
    """The producer writes straight into the bordered buffer the 3x3 conv reads, and the
    1x1 conv reads that buffer's interior (in_pad): no copy adds or drops the border."""
    torch.manual_seed(0)
    model, x = Fork().eval(), torch.randn(1, 8, 10, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # untuned
        net = compile_network(model, x, layout="uniform")  # checked against the model
    kinds = {s.name: s for s in net.steps}
    assert [s.name for s in net.steps if s.kind == "transform"] == \
        ["x: NCHW -> NHWC/p1x1", "mul: NHWC -> NCHW"], [s.name for s in net.steps]
    assert kinds["b"].reads[0] is kinds["c"].reads[0] is kinds["a"].writes[0]
    assert kinds["c"].reads[0].layout.label == "NHWC/p1x1"
    with torch.no_grad():
        assert torch.allclose(net(x), model(x), atol=1e-4, rtol=1e-4)
