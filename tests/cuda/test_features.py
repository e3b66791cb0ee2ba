"""Cost-model features of CUDA configs, read off the rendered kernel (no GPU, no build)."""
import math
import random

import pytest

from raytune_kernels.cuda.render import cuda_space_for, render_cuda
from raytune_kernels.cuda.gpu import GpuInfo, gpu_info
from raytune_kernels.space import Config
from raytune_kernels.errors import UnknownTargetError
from raytune_kernels.cuda.features import blocks_per_sm, family, featurize_cuda, shared_bytes

from tests.support.cuda_cases import CASES

SM90 = gpu_info("sm_90")


def _configs(compute, n: int = 6) -> list[Config]:
    space, rng = cuda_space_for(compute), random.Random(0)
    return list(dict.fromkeys(space.sample(rng) for _ in range(4 * n)))[:n]


def test_arch_figures():
    assert gpu_info("sm_90").sms == 132 and gpu_info("sm_80").sms == 108
    assert gpu_info("sm_90a").sms == 132 and gpu_info("sm_90a").arch == "sm_90a"
    assert gpu_info("sm_100").smem_per_sm == gpu_info("sm_90").smem_per_sm  # newest figures
    assert gpu_info("sm_86").max_threads_per_sm == 1536
    for bad in ("sm_60", "sm90", "gfx90a", ""):
        with pytest.raises(UnknownTargetError, match="arch"):
            gpu_info(bad)


def test_every_family_gives_finite_features_of_one_length():
    lengths, families = set(), set()
    for name, compute in CASES.items():
        rows = [featurize_cuda(compute, c, SM90) for c in _configs(compute)]
        assert all(math.isfinite(v) for row in rows for v in row), name
        lengths |= {len(row) for row in rows}
        families.add(family(compute))
    assert len(lengths) == 1
    assert families == {"gemm", "window", "rows", "elementwise"}


def test_features_tell_configs_apart():
    for name, compute in CASES.items():
        cfgs = _configs(compute)
        if len(cfgs) < 2:
            continue
        rows = {tuple(featurize_cuda(compute, c, SM90)) for c in cfgs}
        assert len(rows) == len(cfgs), name


def test_occupancy_follows_the_kernel_and_the_arch():
    """A GEMM block's shared memory is its two staged slices; resident blocks are capped
    by threads, shared memory and the block limit of the arch."""
    compute = CASES["dense_bias_gelu"]
    cfg = _configs(compute)[0]
    bk, bm, bn = cfg["bk"], cfg["bm"], cfg["bn"]
    assert shared_bytes(render_cuda(compute, cfg)) in {4 * bk * (bm + bn + pad)
                                                       for pad in (0, 4, 8)}
    assert blocks_per_sm(1024, 0, SM90) == 2 and blocks_per_sm(64, 0, SM90) == 32
    assert blocks_per_sm(256, 100 << 10, SM90) == 2
    assert blocks_per_sm(256, 100 << 10, gpu_info("sm_80")) == 1
    # more SMs: the same grid fills a smaller part of one wave
    small = GpuInfo("sm_90", 66, SM90.smem_per_sm, 2048, 32)
    assert featurize_cuda(compute, cfg, small) != featurize_cuda(compute, cfg, SM90)
