"""Tensor-core GEMM kernels without a GPU: the spaces of each precision, sampled configs of
every GEMM case run on the CPU emulator's model of mma.sync and cp.async against the float32
reference within the precision's tolerance, the emulator's model shown to catch what a
wrong kernel gets wrong, and the kernels compiled by NVRTC for sm_80 and sm_90 without
spills."""
import random

import numpy as np
import pytest
import torch

from raytune_kernels.backend import backend_for
from raytune_kernels.cuda.build import compile_cuda, nvrtc_unavailable, resource_problems
from raytune_kernels.cuda.kernel import CudaKernel
from raytune_kernels.cuda.measure import checked_as
from raytune_kernels.cuda.mma import MMA_PRECISIONS
from raytune_kernels.cuda.render import (GEMM_OPS, CudaLoweringError, cuda_pack, cuda_space_for,
                                         cuda_unpack, default_config, render_cuda)
from raytune_kernels.errors import UnknownTargetError
from raytune_kernels.frontend.reference import reference
from raytune_kernels.measure import MeasureOptions, random_operands
from raytune_kernels.precision import tolerance
from raytune_kernels.space import Config, UnionSpace
from tests.support import cuda_emulate
from tests.support.cuda_cases import CASES
from tests.cuda.test_render import zoo_tasks  # noqa: F401  (a fixture)

GEMM_CASES = sorted(n for n, c in CASES.items() if c.op in GEMM_OPS and
                    not (c.op == "conv2d" and c.attr("groups") == c.inputs[0].shape[1]))
needs_cxx = pytest.mark.skipif(cuda_emulate.compiler() is None,
                               reason="no C++ compiler for the CUDA emulator")
needs_nvrtc = pytest.mark.skipif(nvrtc_unavailable() is not None,
                                 reason=f"NVRTC unavailable: {nvrtc_unavailable()}")


def _mma(c, precision: str, rng: random.Random, **over) -> Config:
    """A sampled tensor-core config of `c` in `precision`, knobs in `over` forced."""
    part = dict(cuda_space_for(c, precision).parts)["mma"]
    for _ in range(2000):
        cfg = part.sample(rng)
        if all(cfg[k] == v for k, v in over.items()):
            return Config(tuple(sorted(cfg.knobs + (("kernel", "mma"),))))
    raise AssertionError(f"no config with {over} in the space of {c.describe()}")


def _run(cases_cfgs, sanitizer="address"):
    """Emulate (case name, config) pairs; returns (name, config, got, expected)."""
    runs, meta = [], []
    for name, cfg in cases_cfgs:
        c = CASES[name]
        ops = random_operands(c, 0)
        with torch.no_grad():
            expected = reference(c, *ops)
        runs.append((render_cuda(c, cfg), cuda_pack(c, ops, cfg)))
        meta.append((name, cfg, expected))
    outs = cuda_emulate.emulate_many(runs, sanitizer)
    return [(n, cfg, cuda_unpack(CASES[n], out, cfg), want)
            for (n, cfg, want), out in zip(meta, outs)]


def _within(cfg: Config, got, want) -> bool:
    opts = checked_as(cfg, MeasureOptions())
    return torch.isfinite(got).all() and torch.allclose(got, want, rtol=opts.rtol,
                                                        atol=opts.atol)


def test_fp32_spaces_hold_no_tensor_core_kernel_and_other_precisions_add_them():
    c = CASES["conv3x3_bias_relu"]
    fp32 = cuda_space_for(c)
    assert all("kernel" not in dict(cfg.knobs) for cfg in fp32)
    for p in MMA_PRECISIONS:
        space = cuda_space_for(c, p)
        assert isinstance(space, UnionSpace) and space.key == "kernel"
        parts = dict(space.parts)
        assert set(parts) == {"ffma", "mma"}
        assert parts["ffma"].count() == fp32.count()  # the FFMA kernels, each layout
        for cfg in (space.sample(random.Random(s)) for s in range(20)):
            assert cfg["precision"] == p and cfg["layout"] in ("NCHW", "NHWC")
            assert cfg in space and render_cuda(c, cfg).source
    # windows and rows compute in float32 whatever the precision
    pool = CASES["maxpool3x3_s2"]
    assert cuda_space_for(pool, "fp16") == cuda_space_for(pool)


def test_a_config_names_its_precision_and_is_checked_against_that_space():
    c = CASES["dense_bias_gelu"]
    cfg = _mma(c, "tf32", random.Random(0))
    assert "mma.sync.aligned.m16n8k8" in render_cuda(c, cfg).source
    assert "m16n8k16.row.col.f32.bf16" in render_cuda(
        c, Config(tuple(sorted((k, "bf16" if k == "precision" else v)
                               for k, v in cfg.knobs)))).source
    with pytest.raises(CudaLoweringError, match="precision"):
        render_cuda(c, Config(tuple(sorted((k, "fp64" if k == "precision" else v)
                                           for k, v in cfg.knobs))))
    bad = Config(tuple(sorted((k, 7 if k == "stages" else v) for k, v in cfg.knobs)))
    with pytest.raises(CudaLoweringError, match="not a valid combination"):
        render_cuda(c, bad)


def test_the_untuned_default_of_a_tensor_core_precision_uses_tensor_cores():
    c = CASES["conv1x1_channel_mul_silu"]
    for p in MMA_PRECISIONS:
        cfg = default_config(c, p)
        assert cfg["kernel"] == "mma" and cfg["precision"] == p and cfg["layout"] == "NCHW"
    assert "kernel" not in dict(default_config(c).knobs)


def test_precision_needs_tensor_cores_on_the_arch():
    assert backend_for("cuda -arch=sm_80 -precision=tf32").space(CASES["dense_bias_gelu"])
    with pytest.raises(UnknownTargetError, match="sm_80 or newer"):
        backend_for("cuda -arch=sm_75 -precision=fp16")
    backend_for("cuda -arch=sm_75")  # fp32 runs anywhere


def test_the_cost_model_tells_precisions_and_kernels_apart():
    c = CASES["dense_bias_gelu"]
    be = backend_for("cuda -arch=sm_90 -precision=fp16")
    mma = _mma(c, "fp16", random.Random(1))
    ffma = next(cfg for cfg in (be.space(c).sample(random.Random(s)) for s in range(99))
                if cfg["kernel"] == "ffma")
    x, _ = be.analyze(c, [mma, ffma])
    assert x.shape[0] == 2 and (x[0] != x[1]).any()
    plain = backend_for("cuda -arch=sm_90").analyze(c, [cuda_space_for(c).sample(random.Random(0))])[0]
    assert plain.shape[1] == x.shape[1]  # one feature length for every precision


def _bank_degree(lanes_words, word_bytes: int) -> int:
    """The most distinct words of one bank a warp-wide shared-memory load touches: 4-byte
    loads as one request of 32 lanes, 8-byte loads as two of 16 (a bank pair a word)."""
    groups = [lanes_words] if word_bytes == 4 else [lanes_words[:16], lanes_words[16:]]
    worst = 0
    for group in groups:
        banks = {}
        for w in group:
            banks.setdefault((w * 4 // word_bytes) % (128 // word_bytes), set()).add(w)
        worst = max(worst, max(len(v) for v in banks.values()))
    return worst


def _fragment_reads(source: str, name: str, precision: str):
    """(float offsets of the 32 lanes, bytes a lane loads) for each fragment load of
    operand `name` ("As" or "Bs"), read off the rendered kernel: its row stride from the
    declaration, whether k is its contiguous axis from how fragments index it, whether
    pairs load as float2; lane l holds rows or columns l / 4 at k index l % 4 (tf32) or
    2 (l % 4) and the next (fp16, bf16), as the PTX ISA lays out m16n8k8/m16n8k16."""
    import re
    stride = int(re.search(rf"float {name}\[\d+\]\[\d+\]\[(\d+)\];", source).group(1))
    k_contig = re.search(rf"{name}\[slot\]\[[^]]*\]\[ks", source) is not None
    pairs = f"reinterpret_cast<const float2*>(&{name}[slot]" in source
    lanes = [(lane >> 2, lane & 3) for lane in range(32)]
    step = 1 if precision == "tf32" else 2
    reads = []
    for d in ((0,) if precision == "tf32" or pairs else (0, 1)):
        words = [g * stride + step * t + d if k_contig else (step * t + d) * stride + g
                 for g, t in lanes]
        reads.append((words, 8 if pairs else 4))
    return reads, k_contig, pairs


@pytest.mark.parametrize("precision", MMA_PRECISIONS)
def test_fragment_reads_of_every_tensor_core_kernel_are_free_of_bank_conflicts(precision):
    """Every shared-memory fragment load of a warp, for sampled configs of every GEMM case
    in both operand layouts, touches each bank once: fp16/bf16 pairs adjacent in memory
    are one 8-byte load (two 4-byte loads of an even row stride share banks two ways,
    whatever the padding), and each row padded so the warp's rows fall apart."""
    rng, seen = random.Random(11), set()
    for n in GEMM_CASES:
        for _ in range(6):
            cfg = _mma(CASES[n], precision, rng)
            source = render_cuda(CASES[n], cfg).source
            for name in ("As", "Bs"):
                reads, k_contig, pairs = _fragment_reads(source, name, precision)
                assert pairs == (precision != "tf32" and k_contig), (n, name, cfg.to_json())
                for words, width in reads:
                    assert _bank_degree(words, width) == 1, (n, name, cfg.to_json())
                seen.add(k_contig)
    assert seen == {True, False}  # both layouts met
    # the model sees what the rows padded for tf32 alone cost fp16: conflicts two ways
    old = [g * 36 + 2 * t for g, t in ((lane >> 2, lane & 3) for lane in range(32))]
    assert _bank_degree(old, 4) == 2


@needs_cxx
@pytest.mark.parametrize("precision", MMA_PRECISIONS)
def test_sampled_tensor_core_configs_of_every_gemm_case_match_the_reference(precision):
    rng = random.Random(MMA_PRECISIONS.index(precision))
    pairs = []
    for i, n in enumerate(GEMM_CASES):  # the pipeline depths in turn, where the case has them
        part = dict(cuda_space_for(CASES[n], precision).parts)["mma"]
        depths = sorted({c[part.coupled_names.index("stages")] for c in part.coupled})
        pairs.append((n, _mma(CASES[n], precision, rng, stages=depths[i % len(depths)])))
    errors = {}
    for name, cfg, got, want in _run(pairs):
        assert _within(cfg, got, want), (name, cfg.to_json(), (got - want).abs().max().item())
        errors[name] = (got - want).abs().max().item()
    # the operands really are rounded to the precision (a float32 model would pass at 1e-5)
    assert max(errors.values()) > 1e-4


@needs_cxx
@pytest.mark.parametrize("precision", MMA_PRECISIONS)
def test_the_fill_seed_of_every_gemm_case_matches_the_reference(precision):
    """The small-block seed a search measures first (cuda.render.fill_seed), for 132 SMs,
    so that several cases split their reduction."""
    from raytune_kernels.cuda.render import fill_seed
    pairs = [(n, fill_seed(CASES[n], precision, 132)) for n in GEMM_CASES]
    assert sum(cfg["split"] > 1 for _, cfg in pairs) >= 3
    for name, cfg, got, want in _run(pairs):
        assert _within(cfg, got, want), (name, cfg.to_json(), (got - want).abs().max().item())


@needs_cxx
def test_tf32_kernels_reading_weights_rounded_at_packing_give_the_same_outputs():
    """A tf32 kernel rendered to read its weight operand as it lies (no cvt at each
    fragment read) on weights rounded once by cuda_plan.tf32 gives, bit for bit, what the
    converting kernel gives on the raw weights: the packing rounds as cvt.rna does. The
    weight is A in an NCHW convolution and B elsewhere; the other operand still converts.
    On raw weights the tensor core would truncate them: the emulator's model shows it."""
    from raytune_kernels.compile.cuda_plan import tf32
    from raytune_kernels.cuda.render import rounds_weights

    rng, runs, meta = random.Random(7), [], []
    for name in GEMM_CASES:
        c = CASES[name]
        cfg = _mma(c, "tf32", rng)
        assert rounds_weights(c, cfg) and not rounds_weights(c, _mma(c, "fp16", rng))
        ops = random_operands(c, 1)
        flat = cuda_pack(c, ops, cfg)
        plain, rounded = render_cuda(c, cfg), render_cuda(c, cfg, rounded=True)
        weight = "As[" if c.op == "conv2d" and cfg.get("layout", "NCHW") == "NCHW" else "Bs["
        reads = [line for line in rounded.source.splitlines() if "__float_as_uint(" in line]
        assert reads and all(weight in line for line in reads), name
        assert "__float_as_uint" not in plain.source
        shifted = list(flat)
        shifted[1] = tf32(flat[1])
        assert np.any(shifted[1] != flat[1])
        runs += [(plain, flat), (rounded, shifted), (rounded, flat)]
        meta.append((name, cfg))
    outs = cuda_emulate.emulate_many(runs)
    truncated = 0
    for k, (name, cfg) in enumerate(meta):
        want, got, raw = outs[3 * k: 3 * k + 3]
        assert np.array_equal(got, want), (name, cfg.to_json())
        truncated += not np.array_equal(raw, want)
    assert truncated == len(meta)


@needs_cxx
def test_the_emulator_catches_a_missing_wait_a_wrong_fragment_and_a_missing_barrier():
    c = CASES["conv3x3_bias_relu"]
    rng = random.Random(7)
    cfgs = {"wait": _mma(c, "tf32", rng, stages=2, warps_n=2),
            "fragment": _mma(c, "fp16", rng, stages=1),
            "barrier": _mma(c, "bf16", rng, stages=3, warps_n=2)}
    for name, cfg, got, want in _run([("conv3x3_bias_relu", cfg) for cfg in cfgs.values()]):
        assert _within(cfg, got, want), name

    def broken(cfg, old, new, count=1):
        k = render_cuda(c, cfg)
        assert old in k.source, old
        return CudaKernel(k.name, k.source.replace(old, new, count), k.grid, k.block,
                          k.smem_bytes, k.buffers), cfg
    bad = [broken(cfgs["wait"], "rk_cp_async_wait<0>", "rk_cp_async_wait<1>"),
           broken(cfgs["fragment"], "ks + 2 * t + 8]); af[i][2]", "ks + 2 * t]); af[i][2]"),
           broken(cfgs["barrier"], "rk_cp_async_wait<1>();\n    __syncthreads();",
                  "rk_cp_async_wait<1>();")]
    ops = random_operands(c, 0)
    want = reference(c, *ops)
    outs = cuda_emulate.emulate_many([(k, cuda_pack(c, ops, cfg)) for k, cfg in bad])
    for (k, cfg), out in zip(bad, outs):
        assert not _within(cfg, cuda_unpack(c, out, cfg), want)


@needs_cxx
def test_a_misaligned_16_byte_copy_fails_the_run():
    c = CASES["dense_bias_gelu"]
    cfg = _mma(c, "tf32", random.Random(2), va=4)
    k = render_cuda(c, cfg)
    shifted = k.source.replace("rk_cp_async16(&As[dst][xx][kk], in0 + (x) * 24 + k",
                               "rk_cp_async16(&As[dst][xx][kk], in0 + (x) * 24 + k + 1")
    assert shifted != k.source
    bad = CudaKernel(k.name, shifted, k.grid, k.block, k.smem_bytes, k.buffers)
    with pytest.raises(cuda_emulate.EmulationError, match="misaligned"):
        cuda_emulate.emulate(bad, cuda_pack(c, random_operands(c), cfg))


@needs_cxx
def test_tensor_core_pipelines_are_free_of_data_races():
    rng = random.Random(11)
    pairs = [("conv_batch2_s2_residual", _mma(CASES["conv_batch2_s2_residual"], p, rng,
                                              stages=s, warps_n=2))
             for p, s in (("tf32", 1), ("fp16", 2), ("bf16", 3))]
    for name, cfg, got, want in _run(pairs, sanitizer="thread"):
        assert _within(cfg, got, want), name


def test_tolerances_grow_as_the_format_narrows():
    assert tolerance("fp32").kernel_atol < tolerance("tf32").kernel_atol \
        <= tolerance("bf16").kernel_atol
    assert tolerance("fp16") == tolerance("tf32")
    assert checked_as(Config.of(bm=16), MeasureOptions()).atol == MeasureOptions().atol
    with pytest.raises(ValueError, match="precision"):
        tolerance("fp8")


def _compile_checked(c, cfg, arch):
    kernel = render_cuda(c, cfg)
    result = compile_cuda(kernel.source, arch, f"{kernel.name}.cu")
    where = (c.describe(), cfg.to_json(), arch)
    assert result.error is None, (where, result.error)
    assert resource_problems(result, kernel.threads) == [], where
    assert result.stack_bytes == 0, (where, "spills", result.log)
    assert b"mma.sync" in result.ptx and b"cp.async" in result.ptx


@needs_nvrtc
@pytest.mark.parametrize("arch", ("sm_80", "sm_90"))
def test_every_gemm_case_compiles_on_tensor_cores_without_spills(arch):
    rng = random.Random(arch == "sm_90")
    for i, name in enumerate(GEMM_CASES):
        c = CASES[name]
        _compile_checked(c, _mma(c, MMA_PRECISIONS[i % 3], rng), arch)


@needs_nvrtc
@pytest.mark.slow
@pytest.mark.parametrize("arch", ("sm_80", "sm_90"))
def test_zoo_gemm_tasks_compile_on_tensor_cores_without_spills(zoo_tasks, arch):
    rng = random.Random(5)
    gemms = [t.compute for t in zoo_tasks if t.compute.op in GEMM_OPS and
             isinstance(cuda_space_for(t.compute, "tf32"), UnionSpace)]
    assert len(gemms) > 50
    for i, c in enumerate(gemms):
        _compile_checked(c, _mma(c, MMA_PRECISIONS[i % 3], rng), arch)
        _compile_checked(c, default_config(c, MMA_PRECISIONS[i % 3]), arch)


@needs_cxx
def test_split_k_sums_the_partials_once_and_leaves_its_counters_at_zero():
    """Split-K configs launched twice on the same buffers (as a network replays them):
    right both times, the workspace and counters are scratch buffers before out, and a
    kernel that forgot to reset its counter would leave the second output unwritten."""
    rng = random.Random(12)
    pairs = []
    for i, name in enumerate(GEMM_CASES):
        precision = MMA_PRECISIONS[i % 3]
        part = dict(cuda_space_for(CASES[name], precision).parts)["mma"]
        at = part.coupled_names.index("split")
        factors = sorted({c[at] for c in part.coupled} - {1})
        if factors:  # the largest factor each case allows
            want = factors[-1]
            knobs = dict(zip(part.coupled_names,
                             rng.choice([c for c in part.coupled if c[at] == want])))
            pairs.append((name, Config.of(**knobs, kernel="mma", precision=precision)))
    assert len(pairs) >= 5 and {cfg["split"] for _, cfg in pairs} >= {2, 4, 16}  # long k: 16
    runs, wants = [], []
    for name, cfg in pairs:
        c = CASES[name]
        k, ops = render_cuda(c, cfg), random_operands(c, 0)
        assert [b.role for b in k.buffers][-3:] == ["scratch", "scratch", "out"]
        assert k.grid[2] % cfg["split"] == 0 and "atomicAdd" in k.source
        runs.append((k, cuda_pack(c, ops, cfg)))
        wants.append(reference(c, *ops))
    for (name, cfg), (k, _), out, want in zip(pairs, runs,
                                              cuda_emulate.emulate_many(runs, launches=2),
                                              wants):
        assert _within(cfg, cuda_unpack(CASES[name], out, cfg), want), (name, cfg.to_json())
    k, arrays = runs[0]
    stuck = CudaKernel(k.name, k.source.replace("if (tid == 0) *counter = 0u;", ""), k.grid,
                       k.block, k.smem_bytes, k.buffers)
    once, twice = (cuda_emulate.emulate(stuck, arrays) if n == 1 else
                   cuda_emulate.emulate_many([(stuck, arrays)], launches=2)[0]
                   for n in (1, 2))
    assert torch.isfinite(torch.from_numpy(once)).all()
    assert not torch.isfinite(torch.from_numpy(twice)).all()


@needs_cxx
def test_split_k_is_free_of_data_races():
    c = CASES["conv7x7_stem"]
    cfg = _mma(c, "tf32", random.Random(3), split=2, stages=2)
    for name, cfg, got, want in _run([("conv7x7_stem", cfg)], sanitizer="thread"):
        assert _within(cfg, got, want)
