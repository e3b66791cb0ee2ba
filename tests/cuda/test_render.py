"""The CUDA backend without a GPU: rendered text and launch geometry, sampled configs of
every kernel family run on the CPU emulator against the torch reference, and every zoo
task's kernels compiled by NVRTC for sm_80 and sm_90 within the limits ptxas reports."""
import importlib.util
import math
import os
import random
import subprocess
import sys
import types

import pytest
import torch

import raytune_kernels as rk
from tests.support import cuda_emulate
from raytune_kernels.cuda import build as build_mod
from raytune_kernels.cuda.build import (CudaBuildResult, build_cuda, compile_cuda,
                                        nvrtc_unavailable, resource_problems)
from raytune_kernels.cuda.gemm_views import gemm_view
from raytune_kernels.cuda.render import (CudaLoweringError, cuda_pack, cuda_space_for,
                                         cuda_layouts, cuda_unpack, cuda_unsupported_reason,
                                         operand_layouts, render_cuda)
from raytune_kernels.space import Config
from raytune_kernels.measure import random_operands
from raytune_kernels.frontend.reference import reference
from raytune_kernels.task import Compute, EpilogueOp, TensorSpec

from tests.support.cuda_cases import CASES, conv
from raytune_kernels.cuda.window import is_window

ARCHS = ("sm_80", "sm_90")
needs_nvrtc = pytest.mark.skipif(nvrtc_unavailable() is not None,
                                 reason=f"NVRTC unavailable: {nvrtc_unavailable()}")
needs_cxx = pytest.mark.skipif(cuda_emulate.compiler() is None,
                               reason="no C++ compiler for the CUDA emulator")


@pytest.fixture(scope="module")
def zoo_tasks(zoo_models):
    """Every distinct task of every zoo model (by key), in a stable order."""
    tasks = {}
    for name in sorted(zoo_models):
        model, inputs = zoo_models[name]
        for t in rk.extract_tasks(model, inputs, target="cuda"):
            tasks.setdefault(t.key, t)
    return list(tasks.values())


def test_every_zoo_task_renders_for_cuda(zoo_tasks):
    assert len(zoo_tasks) > 200
    for t in zoo_tasks:
        c = t.compute
        assert cuda_unsupported_reason(c) is None, c.describe()
        cfg = cuda_space_for(c).sample(random.Random(0))
        kernel = render_cuda(c, cfg)
        assert kernel.source.count('extern "C" __global__') == 1
        assert f"{kernel.name}(" in kernel.source and 32 <= kernel.threads <= 1024
        n_ops = len(c.inputs) + sum(len(e.operands) for e in c.epilogue)
        scratch = ["scratch"] * 2 * (cfg.get("split", 1) > 1)  # split-K's partials, counters
        assert [b.role for b in kernel.buffers] == ["in"] * n_ops + scratch + ["out"]
        assert kernel.buffers[-1].size == c.output.numel


def _gemm_cfg(**over):
    knobs = dict(bm=32, bn=64, tm=4, tn=4, interleave=False, va=4, vb=1, bk=16, unroll=4,
                 layout="NCHW", prefetch=False, split=1)
    return Config.of(**{**knobs, **over})


def test_gemm_stages_reduction_tiles_in_shared_memory_and_fuses_the_epilogue():
    c = CASES["conv_batch2_s2_residual"]  # 2x8x9x9 -> 16ch 3x3 s2: m=16, n=25, k=72
    k = render_cuda(c, _gemm_cfg(bm=16, bn=32, tm=1, tn=4))
    assert (k.grid, k.block, k.smem_bytes) == ((1, 1, 2), (128, 1, 1), 0)
    src = k.source
    assert "__shared__ __align__(16) float As[16][20];" in src  # k-major rows padded by 4
    assert "__shared__ __align__(16) float Bs[16][32];" in src
    assert src.count("__syncthreads();") == 2 and "#pragma unroll 4" in src
    assert "reinterpret_cast<const float4*>(wb + x * 72 + k)" in src  # va=4 on weights
    assert "fmaf(a[r], b[c], acc[r][c])" in src
    epilogue = src[src.index("float v0 = acc"):]  # bias, residual, relu, then the store
    assert epilogue.index("e0[grp * 16 + (i)]") < epilogue.index("e1[o0]") \
        < epilogue.index("fmaxf(v0, 0.0f)") < epilogue.index("out[o0] = v0;")


def test_vector_loads_only_where_aligned():
    def nchw(c):
        return dict(cuda_space_for(c).parts)["NCHW"]
    pointwise = nchw(CASES["conv1x1_channel_mul_silu"])  # HW = 64, C = 16
    strided = nchw(CASES["conv1x1_s2"])  # gathered B, K = 12
    odd = nchw(conv((1, 3, 9, 9), 8, 3, 1, 1))  # K = 27
    assert {c[5] for c in pointwise.coupled} == {1, 4} == {c[6] for c in pointwise.coupled}
    assert {c[6] for c in strided.coupled} == {1} and {c[5] for c in strided.coupled} == {1, 4}
    assert {c[5] for c in odd.coupled} == {1}
    stored = render_cuda(CASES["conv1x1_channel_mul_silu"], _gemm_cfg(va=1, vb=4))
    assert "*reinterpret_cast<float4*>(out + o0) = make_float4(v0, v1, v2, v3);" \
        in stored.source


def test_gemm_space_rules_hold_for_every_point(zoo_tasks):
    conv_task = next(t for t in zoo_tasks if t.compute.describe().startswith(
        "conv2d 1x64x56x56 -> 64ch k3x3"))
    space = cuda_space_for(conv_task.compute)
    points = list(space)
    assert len(points) == space.count() == len(set(points)) > 1000
    for cfg in points[::7]:
        threads = cfg["bm"] // cfg["tm"] * (cfg["bn"] // cfg["tn"])
        assert threads % 32 == 0 and 32 <= threads <= 512
        assert 4 * cfg["bk"] * (cfg["bm"] + cfg["bn"] + 8) <= 48 * 1024
        assert cfg["bk"] % cfg["unroll"] == 0


def test_window_and_row_geometry():
    k = render_cuda(CASES["maxpool3x3_s2"], Config.of(threads=64, tw=2, unroll=True,
                                                      layout="NCHW"))
    assert k.grid == (math.ceil(8 * 5 * 3 / 64), 1, 1) and k.block == (64, 1, 1)
    assert "fmaxf(acc[t], xr[iw])" in k.source
    soft = render_cuda(CASES["softmax_axis1"], Config.of(threads=32, vec=1))
    assert soft.grid == (2 * 4 * 5, 1, 1)  # one block per row of 6 (stride 20)
    assert "blockIdx.x / 20 * 120 + blockIdx.x % 20" in soft.source
    assert "rk_block_reduce<rk_max>" in soft.source and "rk_block_reduce<rk_sum>" in soft.source
    ew = render_cuda(CASES["elementwise_chain"], Config.of(threads=64, vec=4, items=2))
    assert ew.grid == (1, 1, 1) and "const float4 ev0 = " in ew.source


def test_bad_configs_name_the_knob():
    c = CASES["conv3x3_bias_relu"]
    with pytest.raises(CudaLoweringError, match=r"missing knobs \['unroll'\]"):
        render_cuda(c, Config(tuple(kv for kv in _gemm_cfg().knobs if kv[0] != "unroll")))
    with pytest.raises(CudaLoweringError, match="unroll=3 is not one of"):
        render_cuda(c, _gemm_cfg(unroll=3))
    with pytest.raises(CudaLoweringError, match=r"bm=16, bn=16, tm=8.*not a valid combination"):
        render_cuda(c, _gemm_cfg(bm=16, bn=16, tm=8, tn=8))
    result = build_cuda(c, _gemm_cfg(unroll=3), "sm_80")
    assert result.cubin is None and "unroll=3" in result.error


def test_unsupported_computes_say_why():
    x = TensorSpec((1, 4, 8))
    half = Compute("softmax", (TensorSpec((2, 8), "float16"),), TensorSpec((2, 8), "float16"),
                   (("dim", 1),))
    assert "float16" in cuda_unsupported_reason(half)
    assert "no CUDA kernel for op 'gather'" in cuda_unsupported_reason(
        Compute("gather", (x,), x))
    norm = Compute("layer_norm", (x,), x, (("eps", 1e-5), ("normalized_shape", (8,))))
    assert "without both weight and bias" in cuda_unsupported_reason(norm)
    bad_bias = Compute("elementwise", (x,), x,
                       epilogue=(EpilogueOp("bias", (TensorSpec((3,)),), axis=1),))
    assert "bias operand of shape (3,) along axis 1" in cuda_unsupported_reason(bad_bias)
    with pytest.raises(CudaLoweringError, match="gather"):
        cuda_space_for(Compute("gather", (x,), x))


def test_pack_checks_operands_and_unpack_restores_the_shape():
    c = CASES["dense_3d_residual"]
    ops, cfg = random_operands(c), cuda_space_for(c).sample(random.Random(0))
    flat = cuda_pack(c, ops, cfg)
    assert [a.size for a in flat] == [160, 320, 20, 200, 200] and not flat[-1].any()
    assert cuda_unpack(c, flat[3], cfg).shape == (2, 5, 20)
    with pytest.raises(ValueError, match=r"operand 1 .* has shape \(16, 20\)"):
        cuda_pack(c, [ops[0], ops[1].T, *ops[2:]], cfg)
    with pytest.raises(ValueError, match="takes 4 operands, got 3"):
        cuda_pack(c, ops[:3], cfg)


def _emulate_samples(names, per_case: int, seed: int, pick=None):
    """Emulate per_case sampled configs of each case (every config: 0; or pick(compute)'s
    list) and compare with the reference; returns how many ran."""
    runs, meta = [], []
    for name in names:
        c = CASES[name]
        ops, rng = random_operands(c, seed), random.Random(seed)
        with torch.no_grad():
            expected = reference(c, *ops)
        space = cuda_space_for(c)
        cfgs = pick(c) if pick else \
            list(space) if per_case == 0 else [space.sample(rng) for _ in range(per_case)]
        for cfg in cfgs:
            runs.append((render_cuda(c, cfg), cuda_pack(c, ops, cfg)))
            meta.append((name, cfg, expected))
    outs = cuda_emulate.emulate_many(runs)
    for (name, cfg, expected), out in zip(meta, outs):
        got = cuda_unpack(CASES[name], out, cfg)
        assert torch.isfinite(got).all(), (name, cfg, "unwritten or non-finite outputs")
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), \
            (name, cfg, (got - expected).abs().max().item())
    return len(runs)


@needs_cxx
def test_sampled_configs_of_every_family_match_the_reference():
    assert _emulate_samples(sorted(CASES), 2, seed=0) == 2 * len(CASES)


@needs_cxx
def test_the_untuned_default_config_of_every_case_matches_the_reference():
    from raytune_kernels.cuda.render import default_config
    assert _emulate_samples(sorted(CASES), 1, seed=4,
                            pick=lambda c: [default_config(c)]) == len(CASES)


@needs_cxx
@pytest.mark.slow
def test_more_configs_match_the_reference():
    assert _emulate_samples(sorted(CASES), 10, seed=1) == 10 * len(CASES)


@needs_cxx
@pytest.mark.slow
def test_every_config_of_small_window_and_row_spaces_matches_the_reference():
    names = [n for n in sorted(CASES) if CASES[n].op not in ("conv2d", "dense", "matmul")
             or n.startswith("depthwise")]
    assert _emulate_samples(names, 0, seed=2) > 200


def _layout_configs(c, layout: str, n: int, rng: random.Random) -> list[Config]:
    """n sampled configs of a conv or window compute that read and write `layout`."""
    space = cuda_space_for(c)
    if hasattr(space, "parts"):  # GEMM convs: one space per layout
        part = dict(space.parts)[layout]
        return [Config(tuple(sorted(part.sample(rng).knobs + (("layout", layout),))))
                for _ in range(n)]
    return [Config(tuple(sorted((k, layout if k == "layout" else v)
                                for k, v in space.sample(rng).knobs))) for _ in range(n)]


@needs_cxx
def test_nhwc_kernels_match_the_reference():
    """Every conv (GEMM and depthwise) and pooling case, in NHWC: residuals read in NHWC,
    per-channel and broadcast operands by their coordinates, the weight packed KRSC."""
    names = [n for n in sorted(CASES) if CASES[n].op in ("conv2d", "max_pool2d",
                                                         "avg_pool2d", "adaptive_avg_pool2d")]
    runs, meta, rng = [], [], random.Random(3)
    for name in names:
        c = CASES[name]
        ops = random_operands(c, 3)
        with torch.no_grad():
            expected = reference(c, *ops)
        for cfg in _layout_configs(c, "NHWC", 3, rng):
            runs.append((render_cuda(c, cfg), cuda_pack(c, ops, cfg)))
            meta.append((name, cfg, expected))
    assert len(names) >= 14
    for (name, cfg, expected), out in zip(meta, cuda_emulate.emulate_many(runs)):
        got = cuda_unpack(CASES[name], out, cfg)
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), \
            (name, cfg, (got - expected).abs().max().item())


def test_nhwc_layouts_of_operands_and_kernels():
    c = CASES["conv_batch2_s2_residual"]  # 2x8x9x9 -> 16ch 3x3 s2, bias and residual
    nhwc = _gemm_cfg(bm=32, bn=16, tm=2, tn=4, layout="NHWC")
    assert operand_layouts(c, nhwc) == ["NHWC", "NHWC", "NCHW", "NHWC"]
    assert operand_layouts(c, _gemm_cfg()) == ["NCHW"] * 4
    assert cuda_layouts(c, nhwc) == ("NHWC", "NHWC")
    src = render_cuda(c, nhwc).source
    assert "xb + (ih * 9 + iw) * 8 + cin" in src  # a pixel's channels are contiguous
    assert "wb + (x) * 72 + k" in src  # KRSC weight rows
    assert "*reinterpret_cast<float4*>(out + o0)" in src  # stores along channels
    dw = CASES["depthwise_relu6"]
    dw_cfg = _layout_configs(dw, "NHWC", 1, random.Random(0))[0]
    assert operand_layouts(dw, dw_cfg)[:2] == ["NHWC", "NCHW"]  # weight as torch has it
    flat = cuda_pack(c, random_operands(c), nhwc)
    x = random_operands(c)[0]
    assert torch.equal(torch.from_numpy(cuda_pack(c, random_operands(c), nhwc)[0]),
                       x.permute(0, 2, 3, 1).reshape(-1))
    assert cuda_unpack(c, flat[0][:c.output.numel], nhwc).shape == c.output.shape
    with pytest.raises(CudaLoweringError, match="layout='NCHWc' is not one of"):
        render_cuda(c, _gemm_cfg(layout="NCHWc"))


def _sampled_with(c, n: int, rng: random.Random, **fixed) -> list[Config]:
    """n sampled configs of c's CUDA space with the given knob values."""
    space, out = cuda_space_for(c), []
    for _ in range(5000):
        cfg = space.sample(rng)
        if all(cfg.get(k) == v for k, v in fixed.items()):
            out.append(cfg)
            if len(out) == n:
                return out
    raise AssertionError(f"no config of {c.describe()} with {fixed}")


@needs_cxx
def test_prefetching_gemms_match_the_reference():
    """Register prefetch of the next reduction slices, on every GEMM case (ragged tiles,
    gathered and vector loads, both conv layouts), several k rounds each."""
    names = [n for n in sorted(CASES) if CASES[n].op in ("dense", "matmul")
             or (CASES[n].op == "conv2d" and not is_window(CASES[n]))]
    runs, meta, rng = [], [], random.Random(4)
    for name in names:
        c = CASES[name]
        ops = random_operands(c, 4)
        with torch.no_grad():
            expected = reference(c, *ops)
        for cfg in _sampled_with(c, 3, rng, prefetch=True):
            runs.append((render_cuda(c, cfg), cuda_pack(c, ops, cfg)))
            meta.append((name, cfg, expected))
    assert len(names) >= 10
    for (name, cfg, expected), out in zip(meta, cuda_emulate.emulate_many(runs)):
        got = cuda_unpack(CASES[name], out, cfg)
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), \
            (name, cfg, (got - expected).abs().max().item())


def test_prefetch_stages_the_next_slices_in_registers():
    c = CASES["conv_batch2_s2_residual"]  # k = 72: rounds at 0, 16, ..., 64 (ragged)
    src = render_cuda(c, _gemm_cfg(bm=16, bn=32, tm=1, tn=4, prefetch=True)).source
    assert "float4 As_r0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);" in src  # va = 4
    assert "float Bs_r0 = 0.0f;" in src and "float Bs_r3 = 0.0f;" in src  # 16x32 / 128
    assert src.count("__syncthreads();") == 2 and "if (k0 + 16 < 72) {" in src
    loop = src[src.index("for (int k0"):]
    # in each round: the staged slices go to shared memory, then the next ones are fetched
    assert loop.index("As[kk + 0][xx] = As_r0.x;") < loop.index("__syncthreads();") \
        < loop.index("const int k = (k0 + 16) + kk") < loop.index("fmaf(a[r], b[c]")


@needs_cxx
def test_split_k_ffma_gemms_sum_their_ranges_once_on_every_launch():
    """Every split factor of the FFMA GEMMs, with and without prefetch, on a long dense
    reduction and on gathered convolutions whose last range is ragged, each kernel launched
    twice on the same buffers as a network replays it (the counters must be reset)."""
    rng, runs, meta = random.Random(6), [], []
    for name in ("dense_long_k", "conv7x7_stem", "conv_batch2_s2_residual"):
        c = CASES[name]
        ops = random_operands(c, 6)
        with torch.no_grad():
            expected = reference(c, *ops)
        factors = {cfg["split"] for cfg in cuda_space_for(c)} - {1}
        for split in sorted(factors):
            for cfg in (_sampled_with(c, 1, rng, split=split, prefetch=p)[0]
                        for p in (False, True)):
                kernel = render_cuda(c, cfg)
                assert kernel.grid[2] % split == 0
                assert [b.role for b in kernel.buffers][-3:] == ["scratch", "scratch", "out"]
                runs.append((kernel, cuda_pack(c, ops, cfg)))
                meta.append((name, cfg, expected))
    assert {cfg["split"] for _, cfg, _ in meta} == {2, 4, 8, 16, 32}
    for (name, cfg, expected), out in zip(meta, cuda_emulate.emulate_many(runs, launches=2)):
        got = cuda_unpack(CASES[name], out, cfg)
        assert torch.isfinite(got).all() and \
            torch.allclose(got, expected, rtol=1e-4, atol=1e-4), (name, cfg.to_json())


def test_a_gemm_config_from_before_split_k_renders_as_split_1():
    """Records written before the FFMA GEMMs had the knob stay valid: the config without
    it is the same kernel as split=1 (a resumed search reads it so: space.completed)."""
    from raytune_kernels.space import completed
    c = CASES["conv3x3_bias_relu"]
    space, new = cuda_space_for(c), _gemm_cfg(bm=16, bn=32, tm=1, tn=4)
    old = Config(tuple(kv for kv in new.knobs if kv[0] != "split"))
    assert old not in space and new in space and completed(old, space) == new
    assert render_cuda(c, old).source == render_cuda(c, new).source
    assert "atomicAdd" not in render_cuda(c, old).source


def test_small_grids_are_seeded_with_the_default_split_to_cover_the_gpu():
    """In fp32, a GEMM whose default grid leaves most SMs idle gets a second seed, the
    default with the smallest split that covers them (or the largest the space has); one
    whose grid already covers half of them, and any other kernel, gets the default alone."""
    from raytune_kernels.backend import _cuda_seeds
    from raytune_kernels.cuda.gpu import gpu_info
    from raytune_kernels.cuda.render import default_config, split_seed
    c = CASES["dense_long_k"]  # K = 512: 2 x 24 outputs, a grid of one or two blocks
    h100 = gpu_info("sm_90")
    default = default_config(c, "fp32")
    seeds = _cuda_seeds(c, "fp32", h100)
    assert seeds[0] == default and len(seeds) == 2
    seed = seeds[1]
    assert seed in cuda_space_for(c, "fp32") and seed["split"] > 1
    assert {k: v for k, v in seed.knobs if k != "split"} == \
        {k: v for k, v in default.knobs if k != "split"}
    blocks = math.prod(render_cuda(c, default).grid)
    factors = sorted({cfg["split"] for cfg in cuda_space_for(c, "fp32")
                      if Config(tuple(kv for kv in cfg.knobs if kv[0] != "split")) ==
                      Config(tuple(kv for kv in default.knobs if kv[0] != "split"))})
    covering = [f for f in factors if f > 1 and blocks * f >= h100.sms]
    assert seed["split"] == (covering[0] if covering else factors[-1])
    assert math.prod(render_cuda(c, seed).grid) == blocks * seed["split"]
    assert split_seed(c, default, sms=blocks) is None  # the grid already covers them
    pool = CASES["maxpool3x3_s2"]
    assert split_seed(pool, default_config(pool), 132) is None
    for precision in ("fp32", "tf32"):
        assert _cuda_seeds(pool, precision, h100) == [default_config(pool, precision)]


@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
def test_tensor_core_gemms_default_to_small_blocks_that_fill_the_gpu(precision):
    """With tensor cores, on a GPU of known SMs, the untuned default is the config of
    ~FILL_TILE-output blocks of 4 warps, NHWC for a convolution, split no further than it
    takes to cover the SMs; the search's second seed is the same rule in NCHW."""
    from raytune_kernels.backend import _cuda_seeds
    from raytune_kernels.cuda.gpu import gpu_info
    from raytune_kernels.cuda.render import FILL_TILE, block_tile, default_config, fill_seed
    h100 = gpu_info("sm_90")
    late = conv((1, 256, 14, 14), 512, 3, 2, 1)  # 49 x 512 outputs, K = 2304
    for c in (CASES["conv3x3_bias_relu"], CASES["dense_long_k"], late):
        fill = default_config(c, precision, h100.sms)
        assert fill == fill_seed(c, precision, h100.sms)
        assert fill in cuda_space_for(c, precision) and fill["kernel"] == "mma"
        assert default_config(c, precision) != fill  # no GPU named: the old rule
        seeds = _cuda_seeds(c, precision, h100)
        if c.op == "conv2d":
            assert fill["layout"] == "NHWC"
            assert seeds == [fill, fill_seed(c, precision, h100.sms, "NCHW")]
            assert seeds[1]["layout"] == "NCHW"
        else:
            assert seeds == [fill]
        bm, bn = block_tile(fill)
        blocks = math.prod(render_cuda(c, fill).grid)
        if c is late:  # tiny GEMMs cap the tile and the warps
            view = gemm_view(c, "NHWC")
            assert bm * bn == FILL_TILE and view.m == 49 and view.n == 512
            assert fill["warps_m"] * fill["warps_n"] == 4 and fill["stages"] == 3
            # 32 tiles: split 4 (128 blocks) is as near 132 SMs as 8 is past them
            assert fill["split"] in (4, 8) and blocks >= 128
        if fill["split"] > 1:  # split because the unsplit grid does not cover the SMs
            assert blocks // fill["split"] < h100.sms
        assert fill_seed(c, precision, 1)["split"] == 1  # one SM: nothing to cover
    pool = CASES["maxpool3x3_s2"]
    assert fill_seed(pool, precision, 132) is None
    assert default_config(pool, precision, 132) == default_config(pool, precision)
    assert fill_seed(late, "fp32", 132) is None


def _emulation_cost(c, kernel, cfg) -> int:
    """Thread-steps the emulator runs: threads launched, times the k loop's barriers."""
    steps = math.ceil(gemm_view(c).k / cfg["bk"]) if "bk" in dict(cfg.knobs) else 1
    return math.prod(kernel.grid) * kernel.threads * steps


@needs_cxx
@pytest.mark.slow
def test_zoo_tasks_at_full_size_match_the_reference(zoo_tasks):
    """Real shapes (big channel counts, 7x7 and 56x56 maps, BERT rows) where the emulator
    can afford them: of every op, the two with the fewest thread-steps."""
    costed = []
    for i, t in enumerate(zoo_tasks):
        cfg = cuda_space_for(t.compute).sample(random.Random(i))
        kernel = render_cuda(t.compute, cfg)
        costed.append((_emulation_cost(t.compute, kernel, cfg), i, t.compute, kernel, cfg))
    picked = []
    for op in sorted({p[2].op for p in costed}):
        cheap = sorted(p for p in costed if p[2].op == op and p[0] <= 300_000)
        picked += cheap[:2]
    assert {p[2].op for p in picked} == {p[2].op for p in costed}
    runs, expected = [], []
    for _, i, c, kernel, cfg in picked:
        ops = random_operands(c, i)
        runs.append((kernel, cuda_pack(c, ops, cfg)))
        with torch.no_grad():
            expected.append(reference(c, *ops))
    for (_, _, c, _, cfg), out, want in zip(picked, cuda_emulate.emulate_many(runs), expected):
        got = cuda_unpack(c, out, cfg)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), \
            (c.describe(), (got - want).abs().max().item())


@needs_cxx
def test_the_emulator_catches_out_of_bounds_and_unwritten_outputs():
    c = CASES["avgpool2x2"]
    cfg = Config.of(threads=64, tw=1, unroll=False, layout="NCHW")
    kernel = render_cuda(c, cfg)
    arrays = cuda_pack(c, random_operands(c), cfg)
    shifted = kernel.__class__(kernel.name, kernel.source.replace("out[o] = v;",
                                                                  "out[o + 1] = v;"),
                               kernel.grid, kernel.block, 0, kernel.buffers)
    skipped = kernel.__class__(kernel.name, kernel.source.replace("out[o] = v;",
                                                                  "if (o) out[o] = v;"),
                               kernel.grid, kernel.block, 0, kernel.buffers)
    with pytest.raises(cuda_emulate.EmulationError, match="AddressSanitizer"):
        cuda_emulate.emulate(shifted, arrays)
    out = cuda_emulate.emulate(skipped, arrays)
    assert torch.isnan(torch.from_numpy(out[:1])).all() and torch.isfinite(
        torch.from_numpy(out[1:])).all()


@needs_cxx
def test_shared_memory_kernels_are_free_of_data_races():
    """ThreadSanitizer over sampled GEMM and row kernels (the ones with __syncthreads),
    and proof that it sees a race: the GEMM without its trailing barrier, where fast
    threads overwrite a tile slower ones are still reading."""
    runs = []
    prefetching = _sampled_with(CASES["conv_batch2_s2_residual"], 1, random.Random(6),
                                prefetch=True)[0]
    for name, cfg in (("conv_grouped_affine_tanh", None), ("matmul_batched_div", None),
                      ("conv_batch2_s2_residual", prefetching),
                      ("softmax_long_rows", Config.of(threads=128, vec=1)),
                      ("layer_norm_long_rows", Config.of(threads=64, vec=4))):
        c = CASES[name]  # rows of several warps: partials cross warps through shared memory
        cfg = cfg or cuda_space_for(c).sample(random.Random(5))
        runs.append((render_cuda(c, cfg), cuda_pack(c, random_operands(c), cfg)))
    cuda_emulate.emulate_many(runs, sanitizer="thread")
    gemm, arrays = runs[0]
    cut = gemm.source.rindex("__syncthreads();")
    racy = gemm.__class__(gemm.name, gemm.source[:cut] + gemm.source[cut + 16:], gemm.grid,
                          gemm.block, 0, gemm.buffers)
    with pytest.raises(cuda_emulate.EmulationError, match="data race"):
        cuda_emulate.emulate(racy, arrays, sanitizer="thread")


def _compile_zoo(zoo_tasks, arch: str, per_task: int, seed: int) -> int:
    compiled = 0
    for i, t in enumerate(zoo_tasks):
        space, rng = cuda_space_for(t.compute), random.Random(seed + i)
        for _ in range(per_task):
            cfg = space.sample(rng)
            kernel = render_cuda(t.compute, cfg)
            result = compile_cuda(kernel.source, arch, f"{kernel.name}.cu")
            where = (t.compute.describe(), cfg.to_json(), arch)
            assert result.error is None, (where, result.error)
            assert "warning" not in result.log, (where, result.log)
            assert resource_problems(result, kernel.threads) == [], where
            assert result.stack_bytes == 0, (where, result.log)
            assert result.cubin[:4] == b"\x7fELF" and f".target {arch}".encode() in result.ptx
            compiled += 1
    return compiled


@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_every_zoo_kernel_compiles_within_limits(zoo_tasks, arch):
    assert _compile_zoo(zoo_tasks, arch, 1, seed=0) == len(zoo_tasks)


@needs_nvrtc
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_more_zoo_configs_compile_within_limits(zoo_tasks, arch):
    assert _compile_zoo(zoo_tasks, arch, 4, seed=100) == 4 * len(zoo_tasks)


@needs_nvrtc
def test_the_small_cases_compile_for_both_archs():
    for c in CASES.values():
        kernel = render_cuda(c, cuda_space_for(c).sample(random.Random(3)))
        for arch in ARCHS:
            result = compile_cuda(kernel.source, arch)
            assert result.error is None and result.registers > 0, (c.describe(), arch)


@pytest.mark.e2e  # every case, 3 seeds, both archs built
@needs_nvrtc
def test_the_cubin_is_read_for_registers_shared_memory_and_stack_as_ptxas_reports_them():
    """NVRTC 13 returns no ptxas report: the figures come from the cubin's
    ELF sections, and agree with ptxas -v's report where NVRTC 12 gives one."""
    compared = 0
    for name, c in sorted(CASES.items()):
        space = cuda_space_for(c)
        for seed in range(3):
            kernel = render_cuda(c, space.sample(random.Random(seed)))
            for arch in ARCHS:
                result = compile_cuda(kernel.source, arch)
                assert result.error is None, (name, arch, result.error)
                reported = build_mod._report(result.log)
                read = build_mod.cubin_resources(result.cubin, arch)
                assert read == {"registers": result.registers, "smem_bytes": result.smem_bytes,
                                "stack_bytes": result.stack_bytes}
                if reported["registers"] is not None:
                    assert read == reported, (name, arch, result.log)
                    compared += 1
    assert compared > 0 or build_mod.nvrtc_version()[0] >= 13


@needs_nvrtc
def test_a_build_without_ptxas_report_still_passes_the_launch_limit_check(monkeypatch):
    c = CASES["softmax_last"]
    monkeypatch.setattr(build_mod, "_log", lambda lib, prog: "")
    result = build_cuda(c, cuda_space_for(c).sample(random.Random(0)), "sm_90")
    assert result.error is None and result.registers > 0 and result.smem_bytes >= 0


def test_an_unreadable_cubin_falls_back_to_the_report_and_then_fails_the_check():
    with pytest.raises(ValueError, match="not a 64-bit"):
        build_mod.cubin_resources(b"not an elf", "sm_90")
    assert build_mod._resources(b"junk", "sm_90", "ptxas info    : Used 12 registers, "
                                "used 0 barriers, 64 bytes smem") == \
        {"registers": 12, "smem_bytes": 64, "stack_bytes": None}
    blind = CudaBuildResult("sm_90", b"junk", b"", None, **build_mod._resources(b"junk", "sm_90",
                                                                                 ""))
    assert resource_problems(blind, 128) == [
        "the register / shared-memory usage could not be read from the build"]


@needs_nvrtc
def test_nvrtc_failures_are_data():
    bad = compile_cuda('extern "C" __global__ void k(float* o) { o[0] = undefined_x; }',
                       "sm_80")
    assert bad.cubin is None and "undefined_x" in bad.error and "sm_80" in bad.error
    assert "bad arch 'sm80'" in compile_cuda("", "sm80").error
    greedy = CudaBuildResult("sm_80", b"x", b"x", None, registers=200, smem_bytes=60000)
    assert resource_problems(greedy, 512) == [
        "200 registers x 512 threads > 65536 per block",
        "60000 bytes of static shared memory > 49152"]


@needs_nvrtc
def test_build_results_round_trip_through_json():
    c = CASES["softmax_last"]
    result = build_cuda(c, cuda_space_for(c).sample(random.Random(0)), "sm_90")
    assert result.error is None and result.library == result.cubin
    assert CudaBuildResult.from_json(result.to_json()) == result


def test_nvrtc_is_loaded_from_the_pip_wheel_when_cupy_cannot_find_it(monkeypatch):
    """The fallback path: CuPy's first load fails, the wheel's libnvrtc is preloaded, and
    the second try works; with no wheel either, the reason names the package to install."""
    from raytune_kernels.cuda import build as cuda_build

    class FakeNvrtc:
        loaded = False

        @classmethod
        def getVersion(cls):
            if not cls.loaded:
                raise OSError("libnvrtc.so.12: cannot open shared object file")
            return (12, 9)
    for name in ("cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["cupy_backends.cuda.libs"].nvrtc = FakeNvrtc
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.nvrtc", FakeNvrtc)
    cuda_build._nvrtc.cache_clear()
    try:
        monkeypatch.setattr(cuda_build, "_preload_wheel_nvrtc", lambda: False)
        assert "pip install nvidia-cuda-nvrtc-cu12" in cuda_build.nvrtc_unavailable()
        cuda_build._nvrtc.cache_clear()
        monkeypatch.setattr(cuda_build, "_preload_wheel_nvrtc",
                            lambda: setattr(FakeNvrtc, "loaded", True) or True)
        assert cuda_build.nvrtc_unavailable() is None
        assert cuda_build.nvrtc_version() == (12, 9)
    finally:
        cuda_build._nvrtc.cache_clear()


def _has_nvrtc_wheel() -> bool:
    try:
        return importlib.util.find_spec("nvidia.cuda_nvrtc") is not None
    except ImportError:  # not even the `nvidia` namespace package
        return False


@pytest.mark.skipif(not _has_nvrtc_wheel(),
                    reason="the nvidia-cuda-nvrtc-cu12 wheel is not installed")
def test_the_wheel_library_directory_is_found():
    from raytune_kernels.cuda import build as cuda_build

    dirs = cuda_build._nvrtc_lib_dirs()
    assert dirs and any(p.startswith("libnvrtc.so") for d in dirs for p in os.listdir(d))


def test_cuda_modules_import_without_cupy():
    code = ("import sys\n"
            "for m in ('cupy', 'cupy_backends', 'ray'): sys.modules[m] = None\n"
            "from raytune_kernels.cuda import build as cuda_build, render as cuda_render\n"
            "from tests.support import cuda_emulate\n"
            "import raytune_kernels.cuda.device as g\n"
            "assert 'cupy is not installed' in cuda_build.nvrtc_unavailable()\n"
            "assert g.gpu_count() == 0\n"
            "r = cuda_build.compile_cuda('', 'sm_80')\n"
            "assert r.cubin is None and 'cupy is not installed' in r.error\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
