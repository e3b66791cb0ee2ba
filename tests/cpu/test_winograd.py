"""Winograd F(2x2, 3x3): where it applies, its loop nest (interpreted) and its machine code
(built and run) against the torch reference, and its layouts equal to the direct conv's."""
import random

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.kernel import run_candidate
from raytune_kernels.cpu.loopnest import interpret
from raytune_kernels.cpu.schedules import lower, pack, space_for, unpack
from raytune_kernels.space import Config
from raytune_kernels.cpu.winograd import applicable, transformed_weights
from raytune_kernels.layout.costs import layouts_of
from raytune_kernels.measure import random_operands
from raytune_kernels.frontend.reference import reference
from raytune_kernels.task import Task

from tests.support.cuda_cases import bias, conv, residual, unary


def _winograd_cfgs(c, n: int, seed: int, **fixed) -> list[Config]:
    space = space_for(c, cpu_info())
    part, rng, out = dict(space.parts)["winograd"], random.Random(seed), []
    while len(out) < n:
        cfg = space._tag("winograd", part.sample(rng))
        if all(cfg[k] == v for k, v in fixed.items()):
            out.append(cfg)
    return out


def test_it_applies_to_3x3_stride_1_convs_with_an_even_output(zoo_models):
    assert applicable(conv((1, 16, 6, 8), 16, 3, 1, 1))
    assert applicable(conv((1, 16, 8, 8), 24, 3, 1, 0))  # 6x6 output: no padding is fine
    assert not applicable(conv((1, 16, 7, 7), 16, 3, 1, 1))  # 7x7: a ragged tile
    assert not applicable(conv((1, 16, 8, 8), 16, 3, 2, 1))  # stride 2
    assert not applicable(conv((1, 16, 8, 8), 16, 3, 1, 2, dil=2))
    assert not applicable(conv((1, 16, 8, 8), 16, 3, 1, 1, groups=2))
    assert not applicable(conv((1, 3, 8, 8), 16, 3, 1, 1))  # channels below a vector
    assert not applicable(conv((2, 16, 8, 8), 16, 3, 1, 1))  # batch 2
    model, inputs = zoo_models["resnet18"]
    picked = {t.compute.describe().split(" +")[0] for t in rk.extract_tasks(model, inputs)
              if applicable(t.compute)}
    assert picked == {"conv2d 1x64x56x56 -> 64ch k3x3 s1", "conv2d 1x128x28x28 -> 128ch k3x3 s1",
                      "conv2d 1x256x14x14 -> 256ch k3x3 s1"}  # layer4's 7x7 maps are odd


def test_transformed_weights_are_g_g_gt():
    w = torch.randn(5, 3, 3, 3, dtype=torch.float64)
    g = torch.tensor([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
                     dtype=torch.float64)
    u = transformed_weights(w)
    for k in range(5):
        for c in range(3):
            want = (g @ w[k, c] @ g.T).reshape(16).float()
            assert torch.allclose(u[:, c, k], want, atol=1e-6)


@pytest.mark.parametrize("out_layout", ["blocked", "nhwc"])
def test_the_loop_nest_matches_the_reference(out_layout):
    """The interpreter runs the nest as written: bias, a residual read in the output's
    layout, relu; tiles that divide the 2x2 tiles and ones that leave a remainder."""
    c = conv((1, 16, 6, 8), 24, 3, 1, 1, epilogue=(bias(), residual(), unary("relu")))
    ops = random_operands(c, 1)
    want = reference(c, *ops)
    for cfg in _winograd_cfgs(c, 3, seed=2, out_layout=out_layout):
        nest, bufs = lower(c, cfg), pack(c, cfg, ops)
        interpret(nest, bufs)
        got = unpack(c, cfg, bufs["out"])
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (cfg, (got - want).abs().max())


def test_built_kernels_of_resnet18_match_the_reference(zoo_models):
    model, inputs = zoo_models["resnet18"]
    tasks = {t.compute.inputs[0].shape: t for t in rk.extract_tasks(model, inputs)
             if applicable(t.compute)}
    assert len(tasks) == 3
    for i, task in enumerate(tasks.values()):
        for cfg in _winograd_cfgs(task.compute, 2, seed=i):
            ops = random_operands(task.compute, i)
            got = run_candidate(task.compute, cfg, ops, threads=2)
            want = reference(task.compute, *ops)
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), \
                (task.compute.describe(), cfg, (got - want).abs().max().item())


def test_it_reads_and_writes_the_direct_convs_layouts():
    c = conv((1, 32, 8, 8), 32, 3, 1, 1)
    task = Task(c.key(), c, 1)
    for cfg in _winograd_cfgs(c, 6, seed=3):
        direct = Config.of(**{k: v for k, v in cfg.to_json().items() if k in
                              ("cb", "ob", "out_layout")})
        assert layouts_of(task, cfg) == layouts_of(task, direct)
    assert layouts_of(task, _winograd_cfgs(c, 1, 0, cb=32)[0])[0] == "NHWC/p1x1"
