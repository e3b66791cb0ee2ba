"""Matmuls reading and writing permuted views in place (gemm_views.StridedMatmulGemm), as
attention's head split and merge give them: sampled FFMA and tensor-core configs of their
spaces run on the CPU emulator from the unpermuted buffers, against the reference of the
permuted tensors; the spaces follow each operand's contiguous axis; what cannot be strided
is refused with a reason."""
import random

import pytest
import torch

from raytune_kernels.cuda.gemm_views import (MatmulGemm, StridedMatmulGemm,
                                             contiguous_strides, gemm_view)
from raytune_kernels.cuda.measure import checked_as
from raytune_kernels.cuda.render import (CudaLoweringError, cuda_pack, cuda_space_for,
                                         render_cuda, strided_problem, strided_space)
from raytune_kernels.frontend.reference import reference
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.space import Config, UnionSpace
from tests.support import cuda_emulate
from tests.support.cuda_cases import make, residual, scalar

needs_cxx = pytest.mark.skipif(cuda_emulate.compiler() is None,
                               reason="no C++ compiler for the CUDA emulator")
B, S, H, D = 2, 12, 3, 8  # batch, tokens, heads, head width: x is [B, S, H * D]


def permuted(shape, dims):
    """(the permuted shape, the element strides of that view of a contiguous `shape`)."""
    base = contiguous_strides(tuple(shape))
    return tuple(shape[d] for d in dims), tuple(base[d] for d in dims)


HEADS = (0, 2, 1, 3)  # [B, S, H, D] -> [B, H, S, D]
KEYS_T = (0, 2, 3, 1)  # [B, S, H, D] -> [B, H, D, S]
SCORES = make("matmul", [(B, H, S, D), (B, H, D, S)], epilogue=[scalar("mul", 0.35),
                                                                  residual("add")])
CONTEXT = make("matmul", [(B, H, S, S), (B, H, S, D)])
GRAM = make("matmul", [(B, H, S, D), (B, H, D, S)])  # A^T of a [B, H, D, S] tensor


def split_heads_strides():
    """Q K^T with both operands the projections' [B, S, H, D] outputs, read in place."""
    return (permuted((B, S, H, D), HEADS)[1], permuted((B, S, H, D), KEYS_T)[1], None)


def merge_heads_strides():
    """P V with V read in place and the context written as [B, S, H, D] (heads merged)."""
    _, out = permuted((B, S, H, D), HEADS)  # [B, H, S, D] at the merged buffer's strides
    return (None, permuted((B, S, H, D), HEADS)[1], out)


def _sample(compute, strides, precision, rng, n):
    space = strided_space(compute, precision, strides)
    parts = dict(space.parts) if isinstance(space, UnionSpace) else {None: space}
    cfgs = []
    for kernel, part in parts.items():
        for _ in range(n):
            cfg = part.sample(rng)
            if kernel is not None:
                cfg = Config(tuple(sorted(cfg.knobs + (("kernel", kernel),))))
            cfgs.append(cfg)
    return cfgs


def _buffers(compute, strides, cfg, seed):
    """The kernel's arrays (the permuted operands as their contiguous originals, the rest
    as cuda_pack makes them) and the reference output in the output's storage order."""
    g = torch.Generator().manual_seed(seed)
    logical = [torch.randn(s.shape, generator=g) for s in compute.inputs]
    extra = [torch.randn(s.shape, generator=g) for op in compute.epilogue for s in op.operands]
    flat = cuda_pack(compute, logical + extra, cfg)
    for i, (x, st) in enumerate(zip(logical, strides[:2])):
        if st is not None:  # the buffer the view reads: x put back where the strides say
            raw = torch.empty(x.numel())
            raw.as_strided(x.shape, st).copy_(x)
            flat[i] = raw.numpy()
    with torch.no_grad():
        want = reference(compute, *logical, *extra)
    if strides[2] is not None:
        out = torch.empty(want.numel())
        out.as_strided(want.shape, strides[2]).copy_(want)
        want = out
    return flat, want.reshape(-1)


@needs_cxx
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_sampled_strided_matmuls_match_the_reference(precision):
    rng, runs, meta = random.Random(3), [], []
    transposed_a = (permuted((B, H, D, S), (0, 1, 3, 2))[1], None, None)  # rows contiguous
    for compute, strides in ((SCORES, split_heads_strides()), (CONTEXT, merge_heads_strides()),
                             (GRAM, transposed_a)):
        for k, cfg in enumerate(_sample(compute, strides, precision, rng, 4)):
            flat, want = _buffers(compute, strides, cfg, k)
            runs.append((render_cuda(compute, cfg, strides), flat))
            meta.append((compute, cfg, want))
    outs = cuda_emulate.emulate_many(runs)
    for (compute, cfg, want), got in zip(meta, outs):
        opts = checked_as(cfg, MeasureOptions())
        got = torch.from_numpy(got.copy())
        assert torch.isfinite(got).all(), (compute.describe(), cfg)
        assert torch.allclose(got, want, rtol=opts.rtol, atol=opts.atol), \
            (compute.describe(), cfg, (got - want).abs().max().item())


def test_the_space_follows_each_operands_contiguous_axis():
    view = gemm_view(SCORES, "NCHW", split_heads_strides())
    assert isinstance(view, StridedMatmulGemm)
    assert (view.a_contig, view.b_contig) == ("k", "k")  # K^T read along the head width
    plain = gemm_view(SCORES)
    assert isinstance(plain, MatmulGemm) and plain.b_contig == "x"
    merged = gemm_view(CONTEXT, "NCHW", merge_heads_strides())
    assert (merged.a_contig, merged.b_contig) == ("k", "x")
    assert "* 24 + (j)" in merged.out("i", "j")  # a row of the context is H * D apart
    gram = gemm_view(GRAM, "NCHW", (permuted((B, H, D, S), (0, 1, 3, 2))[1], None, None))
    assert gram.a_contig == "x"  # A read down its columns
    # the plain matmul's configs render in place where the views allow what they do
    for compute, strides in ((SCORES, split_heads_strides()), (CONTEXT, merge_heads_strides())):
        for precision in ("fp32", "tf32"):
            space = cuda_space_for(compute, precision)
            cfgs = [space.sample(random.Random(i)) for i in range(40)]
            assert all(strided_problem(compute, c, strides) is None for c in cfgs)
    # and a config with 16-byte loads of A is refused where A's rows are not 16-byte apart
    plain = make("matmul", [(1, 2, 4, 8), (1, 2, 8, 4)])
    rows_of_9 = ((72, 36, 9, 1), None, None)
    wide = [c for c in cuda_space_for(plain, "fp32") if c["va"] == 4]
    assert wide and all("va=4" in strided_problem(plain, c, rows_of_9) for c in wide)


def test_vector_loads_need_aligned_runs():
    # a head width of 6: no 16-byte run starts aligned; of 8 with 3 heads, every one does
    odd = make("matmul", [(1, 2, 4, 6), (1, 2, 6, 4)])
    strides = (permuted((1, 4, 2, 6), HEADS)[1], None, None)
    assert not gemm_view(odd, "NCHW", strides).a_vec
    assert gemm_view(SCORES, "NCHW", split_heads_strides()).a_vec


def test_what_cannot_be_strided_says_why():
    with pytest.raises(CudaLoweringError, match="a matmul's only"):
        gemm_view(make("dense", [(4, 8), (16, 8)]), "NCHW", (None, None, None))
    with pytest.raises(CudaLoweringError, match="output's 3 axes"):
        gemm_view(make("matmul", [(2, 4, 8), (8, 4)]), "NCHW", (None, None, None))
    cols = permuted((B, H, D, S), (0, 1, 3, 2))[1]  # the output's columns not contiguous
    with pytest.raises(CudaLoweringError, match="columns must be contiguous"):
        gemm_view(CONTEXT, "NCHW", (None, None, cols))
    with pytest.raises(CudaLoweringError, match="epilogue operand of its shape"):
        gemm_view(SCORES, "NCHW", (None, None, permuted((B, S, H, S), HEADS)[1]))
    cfg = next(iter(cuda_space_for(CONTEXT, "fp32")))
    assert "columns must be contiguous" in strided_problem(CONTEXT, cfg, (None, None, cols))


def test_sibling_denses_keep_their_config_with_the_split_the_larger_grid_allows():
    """Three 768->768 denses of 128 rows as one batched matmul (x shared at stride 0, the
    weights read as they lie): a config split in two for one dense's 192 tiles of 16x32
    would pass the grid's block limit three times over, so the merged kernel runs it
    unsplit; every other knob is kept."""
    from raytune_kernels.compile.cuda_plan import sibling_compute, sibling_config, sibling_strides
    from raytune_kernels.cuda.render import block_tile

    dense = make("dense", [(1, 128, 768), (768, 768)])
    merged, strides = sibling_compute(dense, 3), sibling_strides(dense)
    assert merged.output.shape == (3, 128, 768)
    view = gemm_view(merged, "NCHW", strides)
    assert (view.a_contig, view.b_contig, view.a_strides[0]) == ("k", "k", 0)
    mma = dict(cuda_space_for(dense, "tf32").parts)["mma"]
    cfg = next(c for c in (Config(tuple(sorted(p.knobs + (("kernel", "mma"),)))) for p in mma)
               if c["split"] == 2 and block_tile(c) == (16, 32))
    assert "split=2" in strided_problem(merged, cfg, strides)
    lowered = sibling_config(merged, cfg, strides)
    assert lowered["split"] == 1 and strided_problem(merged, lowered, strides) is None
    assert {k: v for k, v in lowered.knobs if k != "split"} == \
        {k: v for k, v in cfg.knobs if k != "split"}
