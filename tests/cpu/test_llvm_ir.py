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
