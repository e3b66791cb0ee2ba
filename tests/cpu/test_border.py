"""Border refills: where a bordered layout's border lies, and the native fill of it."""
import math

import numpy as np
import pytest
import torch

from raytune_kernels.cpu.border import border_runs, fill_kernel
from raytune_kernels.cpu.build import aligned
from raytune_kernels.cpu.transform import Layout

CASES = [("NCHW16c/p1x1", (1, 32, 5, 7)), ("NHWC/p1x1", (1, 3, 4, 4)),
         ("NCHW/p2x1", (1, 2, 3, 3)), ("NCHW48c/p1x1", (1, 96, 9, 9)),
         ("NHWC/p3x3", (1, 40, 6, 5)), ("NCHW8c/p0x2", (1, 8, 2, 37))]


@pytest.mark.parametrize("label, shape", CASES)
def test_the_runs_cover_exactly_the_border(label, shape):
    layout = Layout.parse(label)
    runs = border_runs(layout, shape)
    covered = np.zeros(layout.size(shape), bool)
    for start, length in runs[1:].reshape(-1, 2):
        assert length > 0 and not covered[start: start + length].any()
        covered[start: start + length] = True
    assert runs[0] == len(runs[1:]) // 2
    assert np.array_equal(covered, layout.pack(torch.zeros(shape), border=1.0) != 0)
    part = border_runs(layout, shape, below=layout.size(shape) // 3)
    kept = np.zeros_like(covered)
    for start, length in part[1:].reshape(-1, 2):
        kept[start: start + length] = True
    assert np.array_equal(kept, covered & (np.arange(covered.size) < covered.size // 3))


@pytest.mark.parametrize("label, shape", CASES)
@pytest.mark.parametrize("value", [0.0, -math.inf])
def test_the_fill_writes_the_border_and_nothing_else(label, shape, value):
    layout, x = Layout.parse(label), torch.randn(shape)
    buf = aligned(layout.pack(x, border=7.0))  # a border some other value left behind
    fill_kernel(value)([buf.ctypes.data, border_runs(layout, shape).ctypes.data], 2)
    assert np.array_equal(buf, layout.pack(x, border=value))
    assert torch.equal(layout.unpack(buf, shape), x)
