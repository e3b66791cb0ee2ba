"""The machine model: measured on this host within what hardware can do, cached per CPU
and feature string, re-measured when the cache is stale or broken."""
import json

from raytune_kernels.cpu.build import host_cpu
from raytune_kernels.cpu.machine import (VERSION, MachineModel, VectorUnit, assumed_model,
                                         cpu_info, load_or_measure, measure_model, model_path,
                                         os_caches)


def test_measured_model_is_physical():
    """Any x86 core: 0.5-4 vector FMAs a cycle at latency 2-8, at 0.5-7 GHz. The host's
    widest unit keeps at least 4 and at most 16 accumulator chains busy."""
    cpu = cpu_info()
    model = measure_model(cpu.lanes, cpu.regs)
    assert model.measured and model.cpu == host_cpu()[0] and 0.5 < model.ghz < 7
    assert [u.lanes for u in model.units] == list(cpu.lanes)
    for u in model.units:
        assert 0.5 <= u.fma_per_cycle <= 4 and 2 <= u.fma_latency <= 8, u
        assert u.loads_per_cycle >= 0.5 and 2 <= u.chains <= 16, u
    assert 4 <= cpu.chains(cpu.lanes[0]) <= 16
    # a core reads 0.5-128 bytes a cycle from L3 or memory, memory no faster than L3 (but
    # for noise)
    assert 0.5 <= model.dram_bytes_per_cycle <= 1.5 * model.l3_bytes_per_cycle <= 192, model
    # the prefetchers keep 4 or more tile rows ahead (at most the 28 timed, which 32
    # registers hold), and a row beyond them costs an update a few cycles at most
    assert 4 <= model.a_streams <= 28 and model.a_streams <= cpu.regs - 2, model
    assert 0 <= model.stream_wait <= 8, model


def test_caches_come_from_the_os():
    l1, l2, l3 = os_caches()
    present = [c for c in (l1, l2, l3) if c]
    assert present == sorted(present) and all(c >= 4096 for c in present)


def test_narrower_vectors_share_the_narrowest_unit():
    model = assumed_model("x", (16, 8))
    assert model.unit(1) == VectorUnit(1, 2.0, 4.0, 2.0) and model.unit(8).lanes == 8
    try:
        assumed_model("x", (8,)).unit(16)
    except ValueError as e:
        assert "no 16-float vector unit" in str(e)
    else:
        raise AssertionError("a wider unit than measured was invented")


def test_json_round_trip():
    model = assumed_model("znver1", (8,))
    assert MachineModel.from_json(json.loads(json.dumps(model.to_json()))) == model


def test_cache_is_read_back_and_replaced_when_stale(tmp_path):
    path = str(tmp_path / "m.json")
    cached = assumed_model(host_cpu()[0], (8,))  # unmistakable: measured=False
    with open(path, "w") as f:
        json.dump(cached.to_json(), f)
    assert load_or_measure(path, (8,), 16) == cached  # read, not measured
    for stale in ({**cached.to_json(), "version": VERSION + 1}, "{not json"):
        with open(path, "w") as f:
            f.write(stale if isinstance(stale, str) else json.dumps(stale))
        fresh = load_or_measure(path, (8,), 16)
        assert fresh.measured and fresh.version == VERSION
        with open(path) as f:
            assert MachineModel.from_json(json.load(f)) == fresh  # and cached again


def test_cache_file_names_the_cpu_and_its_features(tmp_path):
    a = model_path("znver1", "+avx2,+fma", str(tmp_path))
    b = model_path("znver1", "+avx2,+fma,+avx512f", str(tmp_path))
    assert a != b and "znver1" in a and a.startswith(str(tmp_path))


def test_an_older_model_keeps_its_latency_and_pipes_so_the_space_stays(tmp_path):
    """A version-2 model of this host (FMAs a cycle to the half, no bandwidths): the new
    one measures throughput and bandwidths again, keeps its FMA latency and pipes, so every
    width's accumulator chains, which decide the schedule space (and so which records are
    still points of it), are the old model's."""
    cpu = cpu_info()
    older = str(tmp_path / "v2.json")
    units = [{"lanes": n, "fma_per_cycle": 1.5, "fma_latency": 7.0, "loads_per_cycle": 2.0}
             for n in cpu.lanes]
    with open(older, "w") as f:
        json.dump({"cpu": host_cpu()[0], "units": units, "ghz": 3.0,
                   "caches": list(os_caches()), "measured": True, "version": 2}, f)
    model = load_or_measure(str(tmp_path / "v3.json"), cpu.lanes, cpu.regs, older)
    assert model.version == VERSION and model.l3_bytes_per_cycle > 0
    assert [(u.fma_latency, u.pipes, u.chains) for u in model.units] == \
        [(7.0, 1.5, 10)] * len(cpu.lanes)
    # and without one: the pipes are the measured FMAs a cycle to the half
    fresh = load_or_measure(str(tmp_path / "new.json"), cpu.lanes, cpu.regs,
                            str(tmp_path / "none.json"))
    for u in fresh.units:
        assert (u.pipes * 2).is_integer() and abs(u.pipes - u.fma_per_cycle) <= 0.25, u


def test_a_version3_model_keeps_every_figure_and_has_its_streams_measured(tmp_path):
    """This host's version-3 model: version 4 keeps what it measured (the estimate's other
    figures and the space's chains do not move) and adds the streams, measured here."""
    cpu = cpu_info()
    v3 = {**assumed_model(host_cpu()[0], cpu.lanes).to_json(), "ghz": 2.5,
          "l3_bytes_per_cycle": 5.5, "dram_bytes_per_cycle": 2.5, "measured": True,
          "version": 3}
    for key in ("a_streams", "stream_wait"):
        del v3[key]
    older = str(tmp_path / "v3.json")
    with open(older, "w") as f:
        json.dump(v3, f)
    model = load_or_measure(str(tmp_path / "v4.json"), cpu.lanes, cpu.regs,
                            [older, str(tmp_path / "v2.json")])
    assert model.version == VERSION == 4 and model.measured
    assert (model.ghz, model.l3_bytes_per_cycle, model.dram_bytes_per_cycle) == \
        (2.5, 5.5, 2.5)
    assert model.units == assumed_model(host_cpu()[0], cpu.lanes).units
    assert 4 <= model.a_streams <= 28
    with open(tmp_path / "v4.json") as f:
        assert MachineModel.from_json(json.load(f)) == model


def _fake_streams(monkeypatch, slow_from: int | None, wait: float = 0.9,
                  noise: dict | None = None, regs: int = 32) -> dict:
    """machine._streams on a fake core: an update costs `rows` cycles from L1 and, from L2,
    `wait` more for each row beyond `slow_from` (None: never slower); `noise` adds
    cycles to one count's long timing."""
    from raytune_kernels.cpu import machine

    def best_ns(nest, tries=7):
        rows, k, reps = (int(v) for v in nest.name.split("_")[-3:])
        per_update = float(rows)
        if k > 64:
            if slow_from is not None and rows > slow_from:
                per_update += wait * (rows - slow_from)
            per_update += (noise or {}).get(rows, 0.0)
        return per_update * k * reps  # at 1 GHz, cycles are ns
    monkeypatch.setattr(machine, "_best_ns", best_ns)
    return machine._streams(16, regs, 1.0, (48 << 10, 2 << 20, 32 << 20))


def test_streams_are_the_rows_before_the_first_slowdown_and_its_wait(monkeypatch):
    """A core whose prefetchers keep 12 rows: 16 rows and more run 0.9 cycles an update
    slower a row beyond 12; one that keeps every row timed; a lone slow count is noise."""
    assert _fake_streams(monkeypatch, 12) == {"a_streams": 12, "stream_wait": 0.9}
    assert _fake_streams(monkeypatch, None) == {"a_streams": 28, "stream_wait": 0.875}
    assert _fake_streams(monkeypatch, None, noise={16: 8.0}) == \
        {"a_streams": 28, "stream_wait": 0.875}
    # slower already at the fewest rows timed: half of them are kept
    assert _fake_streams(monkeypatch, 4, wait=1.5)["a_streams"] == 4
    # with 16 registers only 8 and 12 rows are timed (and 12 is the most kept)
    assert _fake_streams(monkeypatch, None, regs=16)["a_streams"] == 12
    assert _fake_streams(monkeypatch, 8, regs=16) == {"a_streams": 8, "stream_wait": 0.9}
