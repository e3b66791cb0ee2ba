"""A first compile (no records): transforms priced by a model, not timed, and the network
still equal to the model."""
import math

import numpy as np
import pytest
import torch

from raytune_kernels.compile.api import compile_network
from raytune_kernels.compile.cpu_plan import transform_choice
from raytune_kernels.cpu.transform import Layout
from raytune_kernels.layout import costs
from raytune_kernels.measure import MeasureOptions

GHZ = 3.0
PAIRS = [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW"), ("NCHW", "NHWC/p1x1"),
         ("NHWC", "NCHW32c/p1x1"), ("NCHW32c", "NCHW16c"), ("NCHW", "NCHW/p3x3"),
         ("NCHW64c", "NHWC")]


@pytest.fixture(autouse=True)
def no_cache(monkeypatch):
    """No transform cache: a timing found there would be taken instead of the model."""
    monkeypatch.setenv("RAYTUNE_KERNELS_CACHE", "")


def test_the_model_prices_a_transpose_above_a_vector_copy_and_grows_with_size():
    small, big = (1, 64, 14, 14), (1, 64, 56, 56)
    vector = costs.modeled_seconds(big, "NCHW16c", "NHWC", GHZ)
    transpose = costs.modeled_seconds(big, "NCHW", "NHWC", GHZ)
    assert costs.TRANSFORM_CALL_S < vector < transpose
    assert costs.modeled_seconds(small, "NCHW", "NHWC", GHZ) < transpose


@pytest.mark.parametrize("src,dst", PAIRS)
def test_a_priced_transform_times_nothing_and_its_kernel_is_exact(src, dst):
    shape = (1, 64, 9, 13)
    opts = MeasureOptions(threads=2)
    timed = dict(costs.COUNTS)
    seconds, cfg = transform_choice(shape, src, dst, opts, GHZ)
    assert costs.COUNTS == timed and cfg is not None
    assert seconds == pytest.approx(costs.modeled_seconds(shape, src, dst, GHZ))
    s, d = Layout.parse(src), Layout.parse(dst)
    kernel = costs.transform_kernel(shape, s, d, cfg)
    x = torch.randn(shape)
    out = np.full(d.size(shape), np.nan, np.float32)
    inp = s.pack(x)
    kernel([inp.ctypes.data, out.ctypes.data], 2)
    assert torch.equal(d.unpack(out, shape), x)


def test_trivial_transforms_are_free_or_impossible_without_the_model():
    opts = MeasureOptions()
    assert transform_choice((1, 16, 4, 4), "NHWC", "NHWC", opts, GHZ) == (0.0, None)
    assert math.isinf(transform_choice((1, 24, 4, 4), "NCHW", "NCHW16c", opts, GHZ)[0])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.c3 = torch.nn.Conv2d(32, 48, 1)
        self.fc = torch.nn.Linear(48, 10)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c3(torch.relu(self.c2(y)) + y))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1))


def test_an_untuned_compile_times_no_transform_and_equals_the_model():
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(1, 3, 20, 20)
    timed = costs.COUNTS["timed"]
    with pytest.warns(UserWarning, match="no record"):
        net = compile_network(model, (x,), None, threads=2)
    assert costs.COUNTS["timed"] == timed
    assert {"kernel", "transform"} <= {s.kind for s in net.steps}
    new = torch.randn(1, 3, 20, 20)
    with torch.no_grad():
        assert torch.allclose(net(new), model(new), atol=1e-4, rtol=1e-4)
