"""The CPU measurer (cpu/measure.py): check then time a built candidate, its phases, the
cache flush and cold weights, and errors as data."""
import random
from dataclasses import replace

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.cpu.schedules import space_for
from raytune_kernels.space import Config
from tests.support.fake import FakeMeasurer, analytic_seconds
from raytune_kernels.cpu.measure import measure_built
from raytune_kernels.measure import RUNTIME_ERROR, MeasureOptions, MeasureResult

QUICK = MeasureOptions(threads=1, min_repeat_ms=2, repeats=3)


@pytest.fixture(scope="module")
def dense_task():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
    return rk.extract_tasks(model, (torch.randn(4, 64),))[0]


def test_measure_built_checks_then_times(dense_task):
    cfg = space_for(dense_task.compute, cpu_info()).sample(random.Random(0))
    built = build_for(dense_task.compute, cfg)
    result = measure_built(dense_task.compute, cfg, built.library, QUICK, built.seconds)
    assert result.ok and len(result.times) == 3 and 0 < result.median < 1e-2
    assert result.build_s == built.seconds > 0 and result.run_s > 0
    assert MeasureResult.from_json(result.to_json()) == result


def test_a_measurement_times_its_phases_and_old_json_still_reads(dense_task):
    cfg = space_for(dense_task.compute, cpu_info()).sample(random.Random(0))
    built = build_for(dense_task.compute, cfg)
    result = measure_built(dense_task.compute, cfg, built.library, QUICK, built.seconds)
    assert [name for name, _ in result.phases] == ["load", "check", "timing"]
    assert all(s > 0 for _, s in result.phases)
    assert sum(s for _, s in result.phases) == pytest.approx(result.run_s, rel=0.01)
    old = {k: v for k, v in result.to_json().items() if k != "phases"}
    assert MeasureResult.from_json(old) == MeasureResult(result.times, None, "",
                                                         result.build_s, result.run_s)


def test_a_library_without_the_kernel_is_a_runtime_error(dense_task):
    cfg = space_for(dense_task.compute, cpu_info()).sample(random.Random(0))
    other = build_for(dense_task.compute.__class__(
        "dense", dense_task.compute.inputs, dense_task.compute.output), cfg)
    result = measure_built(dense_task.compute, cfg, other.library, QUICK)
    assert result.error_kind == RUNTIME_ERROR and "undefined symbol" in result.error_msg


def test_bad_configs_are_build_errors_as_data(dense_task):
    bad = Config.of(lanes=16, ob=7, tile_h=1, tile_w=1, cb=1, spatial_order=("ko", "oh"),
                    reduce_order=("co",), parallel=1)
    built = build_for(dense_task.compute, bad)
    assert built.library is None and "ob=7 is not a multiple of lanes=16" in built.error
    built = build_for(dense_task.compute, Config.of(lanes=16, ob=16))
    assert built.library is None and "config has no knob 'tile_h'" in built.error


def test_fake_measurer_is_deterministic_and_injects_faults(dense_task):
    space = space_for(dense_task.compute, cpu_info())
    a, b = space.sample(random.Random(1)), space.sample(random.Random(2))
    import json
    fake = FakeMeasurer({json.dumps(b.to_json(), sort_keys=True): "crashed"})
    assert fake.measure(dense_task, a).median == analytic_seconds(dense_task, a)
    assert fake.measure(dense_task, b).error_kind == "crashed" and fake.calls == 2


def test_cache_flush_between_repeats(dense_task, monkeypatch):
    from raytune_kernels.cpu import measure
    flushes = []
    real = measure._Flusher.__call__
    monkeypatch.setattr(measure._Flusher, "__call__", lambda self: (flushes.append(1),
                                                                    real(self)))
    cfg = space_for(dense_task.compute, cpu_info()).sample(random.Random(0))
    built = build_for(dense_task.compute, cfg)
    # settling off: a set of flushed 2 ms repeats is often retimed, each repeat flushed
    opts = MeasureOptions(threads=1, min_repeat_ms=2, repeats=3, flush_cache=True, settle=0.0)
    result = measure_built(dense_task.compute, cfg, built.library, opts)
    assert result.ok and len(result.times) == 3 and len(flushes) == 3
    flushes.clear()
    settled = measure_built(dense_task.compute, cfg, built.library, replace(opts, settle=0.15))
    assert settled.ok and len(settled.times) == 3 and len(flushes) in (3, 6, 9)
    assert measure._llc_bytes() >= 2 << 20


def test_cold_weights_rotate_identical_copies(dense_task, monkeypatch):
    from raytune_kernels.cpu.kernel import prepare
    from raytune_kernels.cpu.schedules import lower, unpack
    from raytune_kernels.cpu.measure import weight_copies
    from raytune_kernels.measure import random_operands

    compute = dense_task.compute
    cfg = space_for(compute, cpu_info()).sample(random.Random(0))
    built = build_for(compute, cfg)
    prep = prepare(compute, cfg, lower(compute, cfg), built.library,
                   random_operands(compute), 1)
    prep.run()
    want = unpack(compute, cfg, prep.buffers["out"]).clone()
    weights = prep.buffers["b"].nbytes
    assert weight_copies(compute, prep, cache_bytes=5 * weights) == 5
    assert weight_copies(compute, prep, cache_bytes=1) == 2
    prep.rotate("b", 3)
    seen = set()
    for _ in range(6):
        prep.buffers["out"][:] = 0
        prep.cold_run()
        seen.add(prep._rotation[prep._turn][0][prep.order.index("b")].value)
        assert torch.equal(unpack(compute, cfg, prep.buffers["out"]), want)
    assert len(seen) == 3  # three distinct weight copies, each read in turn

    opts = MeasureOptions(threads=1, min_repeat_ms=2, repeats=3, cold_weights=True)
    calls = []
    real = type(prep).cold_run
    monkeypatch.setattr(type(prep), "cold_run", lambda self: (calls.append(1), real(self)))
    result = measure_built(compute, cfg, built.library, opts)
    assert result.ok and calls  # timed through the rotation


def test_rotating_copies_are_aligned_and_lent_to_one_run_at_a_time(dense_task):
    from raytune_kernels.cpu.kernel import prepare
    from raytune_kernels.cpu.schedules import lower
    from raytune_kernels.measure import random_operands

    compute = dense_task.compute
    cfg = space_for(compute, cpu_info()).sample(random.Random(0))
    built = build_for(compute, cfg)
    first, second = (prepare(compute, cfg, lower(compute, cfg), built.library,
                             random_operands(compute), 1) for _ in range(2))
    first.rotate("b", 4)
    copies = [copy for _, copy in first._rotation]
    assert all(c.ctypes.data % 64 == 0 for c in copies)
    assert all((c == first.buffers["b"]).all() for c in copies)
    ends = sorted((c.ctypes.data, c.ctypes.data + c.nbytes) for c in copies)
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:]))  # no two copies overlap
    first.cold_run()
    second.rotate("b", 4)  # the memory is second's now: first must not read its data
    second.cold_run()
    with pytest.raises(RuntimeError, match="rotate"):
        first.cold_run()


def test_a_round_of_one_task_draws_its_operands_and_reference_once(dense_task):
    from raytune_kernels.measure import last_task_operands, operands_and_reference

    ops, expected = last_task_operands(dense_task.compute, 0)
    again = last_task_operands(dense_task.compute, 0)
    assert again[0] is ops and again[1] is expected
    fresh = operands_and_reference(dense_task.compute, 0)
    assert all(torch.equal(a, b) for a, b in zip(ops, fresh[0]))
    assert torch.equal(expected, fresh[1])
    assert last_task_operands(dense_task.compute, 1)[1] is not expected  # another seed
    # another reference function never shares the draws' result
    other = last_task_operands(dense_task.compute, 0, "gpu", lambda xs: xs[0].sum())
    assert other[1].numel() == 1 and last_task_operands(dense_task.compute, 0)[1] is not \
        other[1]


def test_a_task_undefined_on_random_signs_is_checked_on_positive_draws():
    """An RMSNorm's reduce task (mean, + eps, rsqrt) sees the squares as its input: random
    signs make the mean negative and the reference NaN, so every candidate was recorded
    non-finite. The draws are made positive where the reference is not finite."""
    from raytune_kernels.measure import operands_and_reference

    class RMS(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    tasks = rk.extract_tasks(RMS(), (torch.randn(1, 8, 32),))
    task = next(t for t in tasks if t.compute.op == "reduce")
    ops, expected = operands_and_reference(task.compute)
    assert torch.isfinite(expected).all() and all((x >= 0).all() for x in ops)
    cfg = space_for(task.compute, cpu_info()).sample(random.Random(0))
    built = build_for(task.compute, cfg)
    result = measure_built(task.compute, cfg, built.library,
                           MeasureOptions(min_repeat_ms=1, repeats=1))
    assert result.ok, result.error_msg
