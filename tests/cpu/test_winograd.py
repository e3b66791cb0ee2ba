"""Winograd F(2x2, 3x3) and F(4x4, 3x3): where each applies, their loop nests (interpreted)
and machine code (built and run) against the torch reference, and their layouts equal to
the direct conv's."""
import random

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.kernel import run_candidate
from raytune_kernels.cpu.loopnest import interpret
from raytune_kernels.cpu.schedules import lower, pack, space_for, unpack
from raytune_kernels.space import Config
from raytune_kernels.cpu.winograd import F2, F4, VARIANTS, applicable, transformed_weights
from raytune_kernels.layout.costs import layouts_of
from raytune_kernels.measure import random_operands
from raytune_kernels.frontend.reference import reference
from raytune_kernels.task import Task

from tests.support.cuda_cases import bias, conv, residual, unary


def _winograd_cfgs(c, n: int, seed: int, algorithm: str = "winograd", **fixed
                   ) -> list[Config]:
    space = space_for(c, cpu_info())
    part, rng, out = dict(space.parts)[algorithm], random.Random(seed), []
    while len(out) < n:
        cfg = space._tag(algorithm, part.sample(rng))
        if all(cfg[k] == v for k, v in fixed.items()):
            out.append(cfg)
    return out


def test_it_applies_to_3x3_stride_1_convs_whose_tiles_waste_little(zoo_models):
    assert applicable(conv((1, 16, 6, 8), 16, 3, 1, 1))
    assert applicable(conv((1, 16, 8, 8), 24, 3, 1, 0))  # 6x6 output: no padding is fine
    assert applicable(conv((1, 16, 7, 7), 16, 3, 1, 1))  # 7x7: ragged tiles over 8x8
    assert not applicable(conv((1, 16, 3, 3), 16, 3, 1, 1))  # 4x4 covering 3x3: 1.8x
    assert not applicable(conv((1, 16, 8, 8), 16, 3, 2, 1))  # stride 2
    assert not applicable(conv((1, 16, 8, 8), 16, 3, 1, 2, dil=2))
    assert not applicable(conv((1, 16, 8, 8), 16, 3, 1, 1, groups=2))
    assert not applicable(conv((1, 3, 8, 8), 16, 3, 1, 1))  # channels below a vector
    assert not applicable(conv((2, 16, 8, 8), 16, 3, 1, 1))  # batch 2
    model, inputs = zoo_models["resnet18"]
    picked = {t.compute.describe().split(" +")[0] for t in rk.extract_tasks(model, inputs)
              if applicable(t.compute)}
    assert picked == {"conv2d 1x64x56x56 -> 64ch k3x3 s1", "conv2d 1x128x28x28 -> 128ch k3x3 s1",
                      "conv2d 1x256x14x14 -> 256ch k3x3 s1", "conv2d 1x512x7x7 -> 512ch k3x3 s1"}


def test_f4_applies_where_its_tiles_waste_little(zoo_models):
    assert applicable(conv((1, 16, 8, 12), 16, 3, 1, 1), F4)
    assert applicable(conv((1, 16, 6, 8), 16, 3, 1, 1), F4)  # 8x8 over 6x8: 1.33x
    assert not applicable(conv((1, 16, 6, 6), 16, 3, 1, 1), F4)  # 8x8 over 6x6: 1.78x
    assert not applicable(conv((1, 16, 8, 8), 16, 3, 2, 1), F4)
    model, inputs = zoo_models["resnet18"]
    tasks = rk.extract_tasks(model, inputs)
    picked = {t.compute.describe().split(" +")[0] for t in tasks if applicable(t.compute, F4)}
    assert picked == {"conv2d 1x64x56x56 -> 64ch k3x3 s1", "conv2d 1x128x28x28 -> 128ch k3x3 s1",
                      "conv2d 1x256x14x14 -> 256ch k3x3 s1", "conv2d 1x512x7x7 -> 512ch k3x3 s1"}
    for t in tasks:  # the space offers each variant exactly where it applies
        parts = dict(getattr(space_for(t.compute, cpu_info()), "parts", ()))
        for name, variant in VARIANTS.items():
            assert (name in parts) == applicable(t.compute, variant), (t.compute.describe(), name)


@pytest.mark.parametrize("variant", [F2, F4])
def test_the_variants_matrices_compute_a_correlation(variant):
    """Y = A^T [(G g G^T) (.) (B^T d B)] A equals the 3x3 correlation of d and g, in
    float64, for every m x m output of an a x a window."""
    d = torch.randn(variant.a, variant.a, dtype=torch.float64)
    g = torch.randn(3, 3, dtype=torch.float64)
    bt, gm, at = (torch.tensor(x, dtype=torch.float64) for x in (variant.bt, variant.g,
                                                                 variant.at))
    y = at @ ((gm @ g @ gm.T) * (bt @ d @ bt.T)) @ at.T
    want = torch.nn.functional.conv2d(d[None, None], g[None, None])[0, 0]
    assert y.shape == (variant.m, variant.m)
    assert torch.allclose(y, want, atol=1e-12)


@pytest.mark.parametrize("variant", [F2, F4])
def test_transformed_weights_are_g_g_gt(variant):
    w = torch.randn(5, 3, 3, 3, dtype=torch.float64)
    g = torch.tensor(variant.g, dtype=torch.float64)
    u = transformed_weights(w, variant)
    assert u.shape == (variant.xi, 3, 5)
    for k in range(5):
        for c in range(3):
            want = (g @ w[k, c] @ g.T).reshape(variant.xi).float()
            assert torch.allclose(u[:, c, k], want, atol=1e-6)


@pytest.mark.parametrize("algorithm,shape", [("winograd", (1, 16, 6, 8)),
                                             ("winograd4", (1, 16, 8, 12)),
                                             ("winograd", (1, 16, 7, 5)),  # ragged
                                             ("winograd", (1, 16, 4, 9)),  # columns only
                                             ("winograd4", (1, 16, 7, 7)),
                                             ("winograd4", (1, 16, 3, 16))])  # no whole row
@pytest.mark.parametrize("out_layout", ["blocked", "nhwc"])
def test_the_loop_nest_matches_the_reference(out_layout, algorithm, shape):
    """The interpreter runs the nest as written: bias, a residual read in the output's
    layout, relu; GEMM tiles that divide the Winograd tiles and ones that leave a
    remainder."""
    c = conv(shape, 24, 3, 1, 1, epilogue=(bias(), residual(), unary("relu")))
    ops = random_operands(c, 1)
    want = reference(c, *ops)
    for cfg in _winograd_cfgs(c, 3, seed=2, algorithm=algorithm, out_layout=out_layout):
        nest, bufs = lower(c, cfg), pack(c, cfg, ops)
        interpret(nest, bufs)
        got = unpack(c, cfg, bufs["out"])
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (cfg, (got - want).abs().max())


@pytest.mark.parametrize("algorithm", ["winograd", "winograd4"])
def test_built_kernels_of_resnet18_match_the_reference(zoo_models, algorithm):
    """Within the measurer's own tolerance (1e-4): F(4x4)'s larger transforms included,
    at ResNet-18's channel counts."""
    model, inputs = zoo_models["resnet18"]
    variant = VARIANTS[algorithm]
    tasks = {t.compute.inputs[0].shape: t for t in rk.extract_tasks(model, inputs)
             if applicable(t.compute, variant)}
    assert len(tasks) == 4  # layer4's 7x7 maps in ragged tiles
    for i, task in enumerate(tasks.values()):
        for cfg in _winograd_cfgs(task.compute, 2, seed=i, algorithm=algorithm):
            ops = random_operands(task.compute, i)
            got = run_candidate(task.compute, cfg, ops, threads=2)
            want = reference(task.compute, *ops)
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), \
                (task.compute.describe(), cfg, (got - want).abs().max().item())


@pytest.mark.parametrize("algorithm", ["winograd", "winograd4"])
def test_it_reads_and_writes_the_direct_convs_layouts(algorithm):
    c = conv((1, 32, 8, 8), 32, 3, 1, 1)
    task = Task(c.key(), c, 1)
    for cfg in _winograd_cfgs(c, 6, seed=3, algorithm=algorithm):
        direct = Config.of(**{k: v for k, v in cfg.to_json().items() if k in
                              ("cb", "ob", "out_layout")})
        assert layouts_of(task, cfg) == layouts_of(task, direct)
    assert layouts_of(task, _winograd_cfgs(c, 1, 0, cb=32)[0])[0] == "NHWC/p1x1"


def test_its_features_lead_with_the_gemms_loops_ragged_or_not():
    """The cost model reads loops by nesting level: a Winograd kernel's GEMM (whose order
    decides its speed) comes first whether its transforms run over one rectangle of tiles
    or four, so one config's GEMM features match across whole and ragged outputs."""
    from raytune_kernels.cpu.features import MAX_LOOPS, featurize

    cpu = cpu_info()
    whole, ragged = conv((1, 32, 8, 8), 32, 3, 1, 1), conv((1, 32, 7, 7), 32, 3, 1, 1)
    cfg = _winograd_cfgs(whole, 1, seed=4, tile_h=4, out_layout="blocked")[0]
    loops = slice(11 + 7, 11 + 7 + 3 * 3)  # op and algorithm flags, tile, first 3 loops
    assert MAX_LOOPS >= 3
    assert featurize(whole, cfg, cpu)[loops] == featurize(ragged, cfg, cpu)[loops]
