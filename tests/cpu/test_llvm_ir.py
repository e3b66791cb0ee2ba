"""Golden-text tests of the LLVM renderer: the IR for small nests must not drift unseen.

Regenerate after an intended change with: RK_REGOLD=1 python -m pytest tests/cpu/test_llvm_ir.py
"""
import os
import pathlib

import pytest

from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.cpu.loopnest import (SERIAL, UNROLL, Access, Affine, Buffer, EpiStep,
                                          UpdateTile, For, LoopNest, StoreTile, Tile, ZeroTile)
from tests.cpu.test_loopnest import matmul_nest

GOLDEN = pathlib.Path(__file__).parent / "golden"


def serial_tile():
    """A 1x2 tile, 1 vector of 4 lanes, an unrolled reduction of 2, bias-less sigmoid."""
    body = (For("i", 3, SERIAL, (
        ZeroTile("t"),
        For("k", 2, UNROLL, (UpdateTile("t", Access("a", Affine((("i", 2), ("k", 6)))), (0, 1),
                                     Access("b", Affine((("k", 4),)))),)),
        StoreTile("t", Access("out", Affine((("i", 8),))), (0, 4), (EpiStep("sigmoid"),)),
    )),)
    bufs = (Buffer("a", 12, "in"), Buffer("b", 8, "in"), Buffer("out", 24, "out"))
    return LoopNest("small", bufs, (Tile("t", (1, 2), 1),), body, 4)


@pytest.mark.parametrize("name, nest", [("small", serial_tile()), ("matmul", matmul_nest())])
def test_render_matches_golden(name, nest):
    text = render(nest)
    path = GOLDEN / f"{name}.ll"
    if os.environ.get("RK_REGOLD"):
        path.write_text(text)
    assert text == path.read_text()


def test_render_uses_explicit_vectors_fma_and_gomp():
    text = render(matmul_nest())
    assert "<8 x float>" in text and "@\"llvm.fma.v8f32\"" in text
    assert "@\"GOMP_parallel\"" in text and "omp_get_thread_num" in text
    assert "select" in text  # the fused relu before the store


def shared_group():
    """Two stores of one MapGroup sharing x + y: out0 = x + y, out1 = 2 (x + y) - x."""
    from raytune_kernels.cpu.loopnest import Bin, Ld, MapGroup, Num

    x = Ld(Access("a", Affine((("j", 8),))))
    y = Ld(Access("a", Affine((("j", 8),), 4)))
    s = Bin("add", x, y)
    outs = ((Access("out", Affine((("j", 8),))), s),
            (Access("out", Affine((("j", 8),), 4)), Bin("sub", Bin("mul", Num(2.0), s), x)))
    body = (MapGroup(outs, "j", 3),)
    return LoopNest("group", (Buffer("a", 24, "in"), Buffer("out", 24, "out")), (), body, 4)


def test_a_map_group_computes_a_shared_subexpression_once():
    import numpy as np

    from raytune_kernels.cpu.build import LoadedKernel, build
    from raytune_kernels.cpu.loopnest import interpret

    nest = shared_group()
    text = render(nest)
    body = text[text.index("j.body"):]
    assert body.count("fadd") == 1 and body.count("fmul") == 1 and body.count("fsub") == 1
    assert body.count("load <4 x float>") == 2  # x and y, each loaded once
    a = np.arange(24, dtype=np.float32)
    want = {"a": a, "out": np.zeros(24, np.float32)}
    interpret(nest, want)
    x, y = a.reshape(3, 2, 4)[:, 0], a.reshape(3, 2, 4)[:, 1]
    np.testing.assert_array_equal(want["out"].reshape(3, 2, 4)[:, 0], x + y)
    np.testing.assert_array_equal(want["out"].reshape(3, 2, 4)[:, 1], 2 * (x + y) - x)
    got = np.zeros(24, np.float32)
    built = build(text)
    assert built.library, built.error
    LoadedKernel(built.library, nest.name, 2)([a.ctypes.data, got.ctypes.data], 1)
    np.testing.assert_array_equal(got, want["out"])


def test_a_map_group_ends_in_a_partial_vector_that_writes_its_live_lanes_only():
    """10 floats in 4-float vectors: two whole steps, then 2 lanes; nothing past them is
    read or written, natively and interpreted."""
    import numpy as np

    from raytune_kernels.cpu.build import LoadedKernel, build
    from raytune_kernels.cpu.loopnest import Bin, Ld, MapGroup, Num, interpret

    x = Ld(Access("a", Affine((("j", 4),))))
    outs = ((Access("out", Affine((("j", 4),))), Bin("mul", Num(2.0), x)),)
    nest = LoopNest("tailgroup", (Buffer("a", 10, "in"), Buffer("out", 10, "out")), (),
                    (MapGroup(outs, "j", 2, tail=2),), 4)
    a = np.arange(12, dtype=np.float32)  # two floats past the buffer: never read
    want = {"a": a[:10], "out": np.zeros(10, np.float32)}
    interpret(nest, want)
    np.testing.assert_array_equal(want["out"], 2 * a[:10])
    got = np.full(12, -1.0, np.float32)  # two floats past the buffer: never written
    built = build(render(nest))
    assert built.library, built.error
    LoadedKernel(built.library, nest.name, 2)([a.ctypes.data, got.ctypes.data], 1)
    np.testing.assert_array_equal(got, np.concatenate([2 * a[:10], [-1.0, -1.0]]))


def test_a_map_group_may_not_read_what_it_writes():
    from raytune_kernels.cpu.loopnest import Ld, MapGroup

    x = Ld(Access("out", Affine((("j", 4),))))
    with pytest.raises(ValueError, match="reads what it writes: \\['out'\\]"):
        MapGroup(((Access("out", Affine((("j", 4),))), x),), "j", 2)
