import collections
import json
import random
from dataclasses import replace

import pytest

import raytune_kernels as rk
from raytune_kernels.cpu.contraction import contraction
from raytune_kernels.cpu.machine import CpuInfo, VectorUnit, assumed_model
from raytune_kernels.cpu.contraction_space import contraction_space
from raytune_kernels.space import Config

AVX512 = CpuInfo("test", (16, 8), 32, assumed_model("test", (16, 8)))  # 2 pipes x latency 4
AVX2 = CpuInfo("test", (8,), 16, assumed_model("test", (8,)))


@pytest.fixture(scope="module")
def conv_space(zoo_models):
    model, inputs = zoo_models["resnet18"]
    task = next(t for t in rk.extract_tasks(model, inputs)
                if t.compute.describe().startswith("conv2d 1x64x56x56 -> 64ch k3x3"))
    return contraction_space(contraction(task.compute), AVX512)


def test_count_matches_enumeration(conv_space):
    points = list(conv_space)
    assert len(points) == conv_space.count() == len(set(points))


def test_samples_are_valid_and_respect_the_rules(conv_space):
    rng = random.Random(1)
    for _ in range(200):
        cfg = conv_space.sample(rng)
        assert cfg in conv_space
        accs = cfg["tile_h"] * cfg["tile_w"] * cfg["ob"] // cfg["lanes"]
        assert AVX512.chains(cfg["lanes"]) == 8
        assert 8 <= accs <= 32 - cfg["ob"] // cfg["lanes"] - 1
        assert 64 % cfg["ob"] == 0 and 64 % cfg["cb"] == 0 and 1 <= cfg["tile_h"] <= 8


def test_mutate_changes_one_knob_and_stays_valid(conv_space):
    rng = random.Random(2)
    cfg = conv_space.sample(rng)
    for _ in range(100):
        new = conv_space.mutate(cfg, rng)
        assert new in conv_space and new != cfg
        changed = [k for k, v in new.knobs if cfg[k] != v]
        assert 1 <= len(changed) <= 4  # a coupled knob may drag its partners along
        cfg = new


def test_config_json_round_trip(conv_space):
    cfg = conv_space.sample(random.Random(3))
    assert Config.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


def test_avx2_space_has_only_eight_lanes():
    con = contraction(_dense())
    space = contraction_space(con, AVX2)
    assert {c[0] for c in space.coupled} == {8}
    assert all(c[2] * c[3] * c[1] // 8 + c[1] // 8 + 1 <= 16 for c in space.coupled)


def test_fewest_accumulator_chains_follow_the_machine_model():
    """A core with one FMA pipe at latency 5 (256-bit FMAs issued as two 128-bit halves) is
    kept busy by 5 chains: its space admits tiles of 5-7 chains that a two-pipe core's space
    leaves out."""
    one_pipe = VectorUnit(8, fma_per_cycle=1.0, fma_latency=5.0, loads_per_cycle=1.0)
    one_pipe_cpu = CpuInfo("test", (8,), 16, replace(AVX2.machine, units=(one_pipe,)))
    con = contraction(_dense())
    accs = lambda space: {c[2] * c[3] * c[1] // 8 for c in space.coupled}  # noqa: E731
    narrow, wide = accs(contraction_space(con, one_pipe_cpu)), accs(contraction_space(con, AVX2))
    assert min(wide) == 8 and wide < narrow and all(5 <= a < 8 for a in narrow - wide)


def _dense():
    from raytune_kernels.task import Compute, TensorSpec
    return Compute("dense", (TensorSpec((32, 64)), TensorSpec((40, 64))), TensorSpec((32, 40)))


def test_union_space_names_the_algorithm(zoo_models):
    from raytune_kernels.cpu.machine import CpuInfo, assumed_model
    from raytune_kernels.cpu.schedules import space_for
    model, inputs = zoo_models["resnet18"]
    task = [t for t in rk.extract_tasks(model, inputs) if t.compute.op == "conv2d"][3]
    space = space_for(task.compute, CpuInfo("test", (8,), 16, assumed_model("test", (8,))))
    sizes = {name: part.count() for name, part in space.parts}
    assert set(sizes) == {"direct", "im2col"} and space.count() == sum(sizes.values())
    rng = random.Random(5)
    seen = set()
    cfg = space.sample(rng)
    for _ in range(300):
        cfg = space.mutate(cfg, rng)
        assert cfg in space
        seen.add(cfg["algorithm"])
    assert seen == {"direct", "im2col"}
    assert Config.of(algorithm="winograd") not in space


def test_a_config_from_before_a_knob_is_completed_with_its_own_parts_knobs(zoo_models):
    """A bf16 conv's space holds direct convs (prefetch_b) and AMX convs (chunk): a direct
    record from before prefetch_b completes to a direct config of the space, without
    the AMX part's chunk, and mutates like any other (resumed tuning read every knob)."""
    import dataclasses

    from raytune_kernels.cpu.machine import cpu_info
    from raytune_kernels.cpu.schedules import space_for
    from raytune_kernels.space import completed
    model, inputs = zoo_models["resnet18"]
    task = next(t for t in rk.extract_tasks(model, inputs) if t.compute.describe().startswith(
        "conv2d 1x64x56x56 -> 64ch k3x3 s1"))
    cpu = dataclasses.replace(cpu_info(), lanes=(16, 8), amx=True)
    space = space_for(task.compute, cpu, "bf16")
    assert {"direct", "amx"} <= set(dict(space.parts))
    rng = random.Random(2)
    new = next(c for c in (space.sample(rng) for _ in range(500)) if c["algorithm"] == "direct")
    old = Config(tuple(kv for kv in new.knobs if kv[0] != "prefetch_b"))
    full = completed(old, space)
    assert old not in space and full in space and "chunk" not in dict(full.knobs)
    assert dict(full.knobs) == {**dict(old.knobs), "prefetch_b": 0}
    assert space.mutate(full, rng) in space


def test_a_union_space_samples_each_algorithm_alike(zoo_models):
    """The direct part holds far more points than im2col's or Winograd's: sampled by
    size, a search would rarely try the small ones."""
    from raytune_kernels.cpu.machine import cpu_info
    from raytune_kernels.cpu.schedules import space_for
    model, inputs = zoo_models["resnet18"]
    task = next(t for t in rk.extract_tasks(model, inputs) if t.compute.describe().startswith(
        "conv2d 1x512x7x7 -> 512ch k3x3 s1"))
    space = space_for(task.compute, cpu_info())
    sizes = {name: part.count() for name, part in space.parts}
    assert set(sizes) == {"direct", "im2col", "winograd", "winograd4"}
    assert sizes["direct"] > 10 * sizes["winograd"]
    rng = random.Random(3)
    counts = collections.Counter(space.sample(rng)["algorithm"] for _ in range(800))
    assert all(150 <= counts[name] <= 250 for name in sizes), counts
