"""Convolutions on AMX tiles in bf16 (cpu/amx.py): where the space offers them, their loop
nests interpreted against the reference of bf16-rounded operands, their machine code
against the same where this CPU has AMX, the weights' packing, and the bf16 target
through the compile, the network check and a saved network."""
import dataclasses
import random

import numpy as np
import pytest
import torch

from raytune_kernels.backend import backend_for, cpu_backend
from raytune_kernels.cpu.amx import (SHAPES, applicable, chunks, fields_of, fused_pack,
                                     pack_weights, pixel_tile, view)
from raytune_kernels.cpu.contraction import Conv2dContraction
from raytune_kernels.cpu.kernel import run_candidate
from raytune_kernels.cpu.loopnest import from_bf16, interpret, to_bf16
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.measure import checked_as
from raytune_kernels.cpu.schedules import lower, pack, space_for, unpack
from raytune_kernels.errors import UnknownTargetError
from raytune_kernels.frontend.reference import reference
from raytune_kernels.layout.costs import layouts_of
from raytune_kernels.measure import MeasureOptions, random_operands
from raytune_kernels.space import Config
from raytune_kernels.target import parse_target
from raytune_kernels.task import Task

from tests.support.cuda_cases import bias, conv, make, residual, scalar, unary

AMX_CPU = dataclasses.replace(cpu_info(), lanes=(16, 8), amx=True)
HOST_AMX = cpu_info().amx
needs_amx = pytest.mark.skipif(not HOST_AMX, reason="this CPU has no AMX bf16 tiles")

CASES = [  # 1x1 over 7x7 (tiles of 2 rows, a ragged last one); 3x3 stride 2 with a
    # residual; a reduction of 432 padded to 448 (the zero stage); dilation; rows of 37
    # pixels in tiles of 13 and a ragged 11
    conv((1, 32, 7, 7), 32, 1, 1, 0, epilogue=(bias(), unary("relu"))),
    conv((1, 64, 9, 9), 48, 3, 2, 1, epilogue=(bias(), residual())),
    conv((1, 48, 10, 10), 64, 3, 1, 1, epilogue=(bias(),)),
    conv((1, 16, 12, 12), 32, 3, 1, 2, dil=2),
    conv((1, 16, 5, 37), 32, 3, 1, 1, epilogue=(bias(), residual(), unary("relu"))),
    # a stem: 3 channels, each kh's 7 x 3 values folded into one rounded pixel (only the
    # folds at even columns, where stride 2 starts an output column); one at stride 1
    conv((1, 3, 21, 23), 32, 7, 2, 3, epilogue=(bias(), unary("relu"))),
    conv((1, 3, 9, 10), 16, 3, 1, 1, epilogue=(bias(),)),
    # output channels 16 does not divide: a masked last block of 8 (a projection to 24
    # with its residual) and of 8 after two whole ones (3x3, stride 2, 40 outputs)
    conv((1, 48, 9, 11), 24, 1, 1, 0, epilogue=(bias(), residual())),
    conv((1, 16, 10, 10), 40, 3, 2, 1, epilogue=(bias(), unary("relu"))),
    # denses: 40 outputs padded to the channel block; 74 rows in tiles of 16 and a ragged
    # 10, with a residual; one row and a reduction of 80 (zeros to 96)
    make("dense", ((1, 32), (40, 32)), epilogue=(bias(1), unary("gelu"))),
    make("dense", ((2, 37, 48), (32, 48)), epilogue=(bias(2), residual())),
    make("dense", ((1, 80), (10, 80))),
    make("dense", ((1, 37, 256), (48, 256)), epilogue=(bias(2), unary("relu"))),  # 8 steps
    # batched matmuls, both operands rounded at run time: 20 rows (16 and a ragged 4) and a
    # reduction of 48 (zero pairs to 64) with a scalar; 4-d, 37 rows, with a residual
    make("matmul", ((2, 20, 48), (2, 48, 32)), epilogue=(scalar("div", 8.0),)),
    make("matmul", ((1, 3, 37, 64), (1, 3, 64, 48)), epilogue=(residual(),)),
    # an odd reduction of 37 (its last row paired with zeros) into 20 columns (a masked
    # last block); 197 columns of 64, as ViT's attention scores
    make("matmul", ((2, 20, 37), (2, 37, 20)), epilogue=(scalar("div", 8.0),)),
    make("matmul", ((1, 3, 19, 64), (1, 3, 64, 197))),
]


def _configs(c, n: int, seed: int) -> list[Config]:
    """n configs, in turn of each way A reaches the tiles: direct fields, im2col fields
    rounded per block just before its products (fused_pack), im2col fields rounded for
    the whole image first."""
    space = space_for(c, AMX_CPU, "bf16")
    part, rng, out = dict(space.parts)["amx"], random.Random(seed), []
    kinds = ("any",) if c.op == "matmul" else \
        {("folded",): ("folded",), ("im2col",): ("fused", "ahead")}.get(
            fields_of(view(c)), ("direct", "fused", "ahead"))
    while len(out) < n:
        cfg = space._tag("amx", part.sample(rng))
        kind = "any" if c.op == "matmul" else cfg["fields"] if cfg["fields"] != "im2col" \
            else "fused" if fused_pack(cfg) else "ahead"
        if kind == kinds[len(out) % len(kinds)]:
            out.append(cfg)
    return out


def _bf16_reference(c, ops) -> torch.Tensor:
    """The reference with the conv's input and weights rounded to bf16, in float64: what
    the tiles compute, up to the order of float32 sums."""
    rounded = [torch.from_numpy(from_bf16(to_bf16(x.numpy()))).reshape(x.shape)
               if i < 2 else x for i, x in enumerate(ops)]
    return reference(c, *(x.double() for x in rounded)).float()


def test_the_space_offers_amx_in_bf16_on_a_cpu_with_it():
    c = CASES[0]
    assert "amx" in dict(space_for(c, AMX_CPU, "bf16").parts)
    assert "amx" not in dict(getattr(space_for(c, AMX_CPU), "parts", ()))  # fp32
    no_amx = dataclasses.replace(AMX_CPU, amx=False)
    assert not applicable(c, no_amx, "bf16")
    assert fields_of(Conv2dContraction.from_compute(conv((1, 3, 8, 8), 16, 7, 2, 3))) == \
        ("folded",)  # 3 channels: 7 x 3 values a kh, folded
    stem = next(x for x in _configs(CASES[5], 1, 0))
    ws = next(b.size for b in lower(CASES[5], stem).buffers if b.name == "ws")
    assert ws == (21 + 6) * 12 * 16  # every padded row, the 12 folds an output column reads
    assert not applicable(conv((1, 24, 8, 8), 16, 3, 1, 1), AMX_CPU, "bf16")  # 3 x 24 > 64
    assert not applicable(conv((1, 3, 8, 8), 16, 3, 1, 2, dil=2), AMX_CPU, "bf16")
    assert applicable(conv((1, 32, 8, 8), 24, 1), AMX_CPU, "bf16")  # 24: 16 and 8 masked
    assert {cfg["nt"] for cfg in _configs(conv((1, 32, 8, 8), 24, 1), 20, 0)} == {1}
    assert not applicable(conv((1, 32, 8, 8), 32, 3, 1, 1, groups=2), AMX_CPU, "bf16")
    assert not applicable(conv((2, 32, 8, 8), 32, 1), AMX_CPU, "bf16")  # batch 2
    shapes = {(cfg["mt"], cfg["nt"]) for cfg in _configs(conv((1, 32, 8, 8), 96, 1), 300, 0)}
    assert shapes == set(SHAPES)  # nt = 3 divides 96 / 16 channel tiles
    assert all(m * n + m + n <= 8 for m, n in SHAPES)  # the 8 tile registers


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_loop_nest_computes_the_conv_of_bf16_operands(case):
    c = CASES[case]
    for i, cfg in enumerate(_configs(c, 6, case)):
        ops = random_operands(c, i)
        bufs = pack(c, cfg, ops)
        interpret(lower(c, cfg), bufs)
        got = unpack(c, cfg, bufs["out"])
        want = _bf16_reference(c, ops)
        assert (got - want).abs().max() <= 1e-5 * want.abs().max(), cfg.to_json()
        exact = reference(c, *ops)  # and within bf16's kernel tolerance of float32's
        assert torch.allclose(got, exact, rtol=5e-2, atol=5e-2)


@needs_amx
@pytest.mark.parametrize("case", range(len(CASES)))
def test_built_kernels_compute_what_the_nest_says(case):
    c = CASES[case]
    for i, cfg in enumerate(_configs(c, 4, 10 + case)):
        ops = random_operands(c, i)
        got = run_candidate(c, cfg, ops, threads=2)
        want = _bf16_reference(c, ops)
        assert (got - want).abs().max() <= 1e-5 * want.abs().max(), cfg.to_json()


def test_a_dense_is_the_1x1_conv_of_its_rows_into_channels_padded_to_the_block():
    d = make("dense", ((2, 37, 48), (40, 48)), epilogue=(bias(2),))
    con = view(d, 32)
    assert (con.c, con.h, con.w, con.k, con.kh, con.kw, con.oh, con.ow) == \
        (48, 74, 1, 64, 1, 1, 74, 1)
    assert fields_of(con) == ("im2col",)  # tiles of 16 rows, not of one row's 1 pixel
    assert pixel_tile(con) == (16, 1)
    assert applicable(d, AMX_CPU, "bf16") and not applicable(d, AMX_CPU, "fp32")
    assert not applicable(make("dense", ((1, 24), (32, 24))), AMX_CPU, "bf16")  # K = 24
    configs = _configs(d, 60, 0)
    assert {cfg["nt"] for cfg in configs} == {1, 2, 3}  # N padded for any nt
    assert layouts_of(Task(d.key(), d, 1), configs[0]) == ("NCHW", "NCHW")  # row-major


@pytest.mark.parametrize("native", [False, True])
def test_a_reduction_walked_in_chunks_adds_up_to_the_whole(native):
    """chunk: each block's products over part of the reduction, added to its C tiles,
    the inner block loop inside the chunk loop (either loop outer, fields rounded per
    block or ahead) or each fused block alone (parallel 2)."""
    if native and not HOST_AMX:
        pytest.skip("this CPU has no AMX bf16 tiles")
    c = CASES[12]
    assert chunks(view(c), "im2col") == (0, 4)
    assert chunks(view(c), "direct") == (0,)
    base = dict(_configs(c, 1, 0)[0].knobs)
    for order, parallel in ((("ko", "pt"), 1), (("pt", "ko"), 1), (("pt", "ko"), 2)):
        cfg = Config(tuple(sorted({**base, "chunk": 4, "mt": 2, "nt": 1, "ob": 16,
                                   "spatial_order": order, "parallel": parallel}.items())))
        ops = random_operands(c, 1)
        if native:
            got = run_candidate(c, cfg, ops, threads=2)
        else:
            bufs = pack(c, cfg, ops)
            interpret(lower(c, cfg), bufs)
            got = unpack(c, cfg, bufs["out"])
        want = _bf16_reference(c, ops)
        assert (got - want).abs().max() <= 1e-5 * want.abs().max(), cfg.to_json()
    with pytest.raises(ValueError, match="chunk=3"):
        lower(c, Config(tuple(sorted({**base, "chunk": 3}.items()))))


def test_a_matmul_rounds_b_into_pairs_of_the_reduction_per_16_columns():
    """The kernel's own rounding of B (an activation) lays it out as pack_weights lays
    out a dense's weights: the same tiles read either."""
    c = make("matmul", ((1, 16, 48), (1, 48, 32)))
    assert applicable(c, AMX_CPU, "bf16")
    assert applicable(make("matmul", ((1, 16, 37), (1, 37, 20))), AMX_CPU, "bf16")
    assert not applicable(make("matmul", ((3, 5, 16), (16, 32))), AMX_CPU, "bf16")  # broadcast
    odd = make("matmul", ((1, 16, 37), (1, 37, 20)))  # N's last block partial: nt 1
    assert {cfg["nt"] for cfg in _configs(odd, 20, 0)} == {1}
    cfg = _configs(c, 1, 0)[0]
    ops = random_operands(c, 0)
    bufs = pack(c, cfg, ops)
    interpret(lower(c, cfg), bufs)
    w = ops[1][0].t()  # [N][K], as a dense's weights
    want = pack_weights(w[:, :, None, None], view(make("dense", ((1, 48), (32, 48)))), 48, 32)
    assert np.array_equal(bufs["wb"].view(np.uint32), want.view(np.uint32))


def test_pixel_tiles_are_whole_rows_or_near_equal_parts_of_one():
    con = Conv2dContraction.from_compute
    assert pixel_tile(con(conv((1, 16, 7, 7), 16, 1))) == (2, 7)
    assert pixel_tile(con(conv((1, 16, 7, 7), 16, 1)), "direct") == (1, 7)  # one row
    assert pixel_tile(con(conv((1, 16, 14, 14), 16, 1))) == (1, 14)
    assert pixel_tile(con(conv((1, 16, 56, 56), 16, 1))) == (1, 14)
    assert pixel_tile(con(conv((1, 16, 112, 112), 16, 1))) == (1, 16)
    assert pixel_tile(con(conv((1, 16, 1, 4), 16, 1))) == (1, 4)  # one row in all


@pytest.mark.parametrize("native", [False, True])
def test_bordered_outputs_and_residuals_read_and_write_the_interior(native):
    """Where the plan gives the output a border its reader wants (out_pad) or reads the
    residual from a bordered buffer (res_pad), the kernel writes and reads the interior
    alone: the border is never written."""
    if native and not HOST_AMX:
        pytest.skip("this CPU has no AMX bf16 tiles")
    c = CASES[4]
    for i, base in enumerate(_configs(c, 4, 7)):
        cfg = Config(tuple(sorted(dict(base.knobs, out_pad=(1, 2), res_pad=(2, 1)).items())))
        ops = random_operands(c, i)
        if native:
            got = run_candidate(c, cfg, ops, threads=2)
        else:
            bufs = pack(c, cfg, ops)
            out = bufs["out"]
            out[:] = 7.0
            interpret(lower(c, cfg), bufs)
            got = unpack(c, cfg, out)
            assert np.count_nonzero(out == 7.0) == out.size - got.numel()  # the border
        want = _bf16_reference(c, ops)
        assert (got - want).abs().max() <= 1e-5 * want.abs().max(), cfg.to_json()


def test_blocks_one_thread_runs_in_turn_share_their_scratch_slot():
    """A block's C tiles go to scratch and its epilogue reads them back at once: the
    serial loop's blocks, inside the parallel one, share one slot; both loops fused into
    the parallel one (parallel 2) give each block its own."""
    c = CASES[0]  # 32 outputs: two blocks of 16 at nt 1
    base = dict(next(x for x in _configs(c, 20, 3) if x["nt"] == 1).knobs)

    def scratch(order, parallel):
        cfg = Config(tuple(sorted({**base, "spatial_order": order,
                                   "parallel": parallel}.items())))
        return next(b.size for b in lower(c, cfg).buffers if b.name == "cs")
    whole = scratch(("pt", "ko"), 2)
    assert scratch(("ko", "pt"), 2) == whole
    assert scratch(("pt", "ko"), 1) * 2 == whole  # the two channel blocks share
    assert scratch(("ko", "pt"), 1) < whole  # the pixel blocks share


def test_direct_fields_take_each_tap_from_the_input_rounded_once():
    """Direct fields round the bordered input once (each pixel's channels padded to 32)
    and read every (kh, kw) from it at the stride: one tap per kernel position."""
    from raytune_kernels.cpu.loopnest import AmxGemm

    c = CASES[2]  # 48 channels: pixels of 64 rounded values, 16 of them zeros
    cfg = next(x for x in _configs(c, 3, 0) if x["fields"] == "direct")
    nest = lower(c, cfg)
    gemms = []

    def walk(body):
        for st in body:
            if isinstance(st, AmxGemm):
                gemms.append(st)
            walk(getattr(st, "body", ()))
    walk(nest.body)
    hp, wp = Conv2dContraction.from_compute(c).padded()
    assert {g.taps for g in gemms} == {tuple((kh * wp + kw) * 32 for kh in range(3)
                                             for kw in range(3))}
    assert next(b.size for b in nest.buffers if b.name == "ws") == hp * wp * 32


def test_weights_are_packed_in_pairs_of_the_reduction_per_16_channels():
    c = conv((1, 32, 4, 4), 32, 1)
    con = Conv2dContraction.from_compute(c)
    w = torch.zeros(32, 32, 1, 1)
    w[21, 7] = 3.0
    values = from_bf16(pack_weights(w, con, 32, 16).view(np.uint16))
    # tile of channels 16-31, step 0, pair 3, channel 16+5, second value of the pair
    at = ((1 * 1 + 0) * 16 + 3) * 32 + 5 * 2 + 1
    assert values[at] == 3.0 and np.count_nonzero(values) == 1


def test_bf16_rounds_to_nearest_with_ties_to_even():
    x = np.concatenate([np.random.default_rng(0).standard_normal(1000).astype(np.float32),
                        np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -0.0, np.inf], np.float32)])
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(to_bf16(x), want)
    assert np.isnan(from_bf16(to_bf16(np.array([np.nan], np.float32))))[0]


def test_amx_configs_read_and_write_the_layouts_they_name():
    c = CASES[1]
    cfg = _configs(c, 1, 3)[0]
    src, dst = layouts_of(Task(c.key(), c, 1), cfg)
    assert src == "NHWC/p1x1"  # with its padding as a border, as the direct conv reads
    assert dst == "NHWC"


def test_an_amx_kernel_is_checked_at_bf16s_tolerance():
    opts = MeasureOptions()
    cfg = _configs(CASES[0], 1, 0)[0]
    assert (checked_as(cfg, opts).rtol, checked_as(cfg, opts).atol) == (5e-2, 5e-2)
    direct = Config((("algorithm", "direct"),))
    assert checked_as(direct, opts) is opts


def test_the_bf16_target_is_a_cpu_target_refused_without_amx():
    tgt = parse_target("llvm -precision=bf16")
    assert (tgt.kind, tgt.precision, str(tgt)) == ("llvm", "bf16", "llvm -precision=bf16")
    for bad in ("llvm -precision=fp16", "llvm -precision=tf32"):
        with pytest.raises(UnknownTargetError, match="for llvm"):
            parse_target(bad)
    no_amx = dataclasses.replace(cpu_info(), amx=False)
    with pytest.raises(UnknownTargetError, match="AMX"):
        cpu_backend(no_amx, precision="bf16")
    if HOST_AMX:
        assert "amx" in dict(backend_for(tgt).space(CASES[0]).parts)


def test_a_bf16_compile_is_refused_on_a_cpu_without_amx(monkeypatch):
    import raytune_kernels.compile.cpu_network as cpu_network
    from raytune_kernels.compile.api import compile_network
    from raytune_kernels.errors import CompileError

    monkeypatch.setattr(cpu_network, "cpu_info",
                        lambda mcpu=None: dataclasses.replace(cpu_info(mcpu), amx=False))
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1)).eval()
    with pytest.raises(CompileError, match="AMX"):
        compile_network(model, torch.randn(1, 16, 8, 8), None, target="llvm -precision=bf16")


@needs_amx
def test_an_untuned_bf16_network_runs_amx_convs_within_its_tolerance():
    from raytune_kernels.compile.api import compile_network

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 32, 3, stride=2, padding=1)).eval()
    x = torch.randn(1, 32, 20, 20)
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, x, None, target="llvm -precision=bf16", threads=2)
    kernels = [s.kernel.name for s in net.steps if s.kernel is not None]
    assert any(name.endswith("_amx") for name in kernels), kernels
    with torch.no_grad():
        want = model(x)
    err = ((net(x) - want).abs().max() / want.abs().max()).item()
    assert 1e-6 < err <= 5e-2  # rounded as bf16 rounds, and no more


def test_blocked_layouts_lower_as_well():
    """The space keeps to NHWC; with im2col fields the lowering also reads NCHW[cb]c and
    writes NCHW[16*nt]c, as a config written by hand may ask (direct fields refuse a
    blocked input, by name)."""
    c = CASES[2]
    for i, base in enumerate(_configs(c, 3, 5)):
        blocked = dict(base.knobs, cb=16, out_layout="blocked")
        if base["fields"] == "direct":
            with pytest.raises(ValueError, match="direct fields read NHWC"):
                lower(c, Config(tuple(sorted(blocked.items()))))
            blocked["fields"] = "im2col"
        cfg = Config(tuple(sorted(blocked.items())))
        ops = random_operands(c, i)
        bufs = pack(c, cfg, ops)
        interpret(lower(c, cfg), bufs)
        want = _bf16_reference(c, ops)
        got = unpack(c, cfg, bufs["out"])
        assert (got - want).abs().max() <= 1e-5 * want.abs().max(), cfg.to_json()


@needs_amx
def test_a_saved_bf16_network_loads_and_gives_the_same_outputs(tmp_path):
    import raytune_kernels as rk
    from raytune_kernels.compile.api import compile_network

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 7, stride=2, padding=3),
                                torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1)).eval()
    x = torch.randn(1, 3, 24, 24)
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, x, None, target="llvm -precision=bf16", threads=2)
    assert sum(s.kernel.name.endswith("_amx") for s in net.steps if s.kernel) == 2
    net.save(str(tmp_path / "net.rkn"))
    loaded = rk.load(str(tmp_path / "net.rkn"))
    assert torch.equal(loaded(x), net(x))


class _Attention(torch.nn.Module):
    """One attention head's worth of denses and batched matmuls: 128 tokens, width 64."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(64, 64) for _ in range(3))
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
        return self.out(torch.nn.functional.gelu(scores @ v)) + x


@needs_amx
def test_an_untuned_bf16_transformer_runs_denses_and_matmuls_on_tiles_and_saves(tmp_path):
    import raytune_kernels as rk
    from raytune_kernels.compile.api import compile_network

    torch.manual_seed(0)
    model, x = _Attention().eval(), torch.randn(1, 128, 64)
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, x, None, target="llvm -precision=bf16", threads=2)
    tiled = {s.kernel.name for s in net.steps
             if s.kernel is not None and s.kernel.name.endswith("_amx")}
    # two dense kernels (q, k, v share one; the output's adds x), so a matmul at least
    assert len(tiled) >= 3, [s.kernel.name for s in net.steps if s.kernel]
    with torch.no_grad():
        want = model(x)
    err = ((net(x) - want).abs().max() / want.abs().max()).item()
    assert 1e-6 < err <= 5e-2
    net.save(str(tmp_path / "attn.rkn"))
    assert torch.equal(rk.load(str(tmp_path / "attn.rkn"))(x), net(x))
