"""The elementwise vocabulary beyond activations (mish, exp, erf, sqrt, rsqrt, square, neg,
abs, pow by constants (integers by repeated multiplication: GELU-tanh's cube), clamp /
hardtanh by constants, maximum / minimum): captured with no
island, fused into the kernel before them where they can be, and checked against PyTorch
through an untuned compile on a new input."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network
from raytune_kernels.frontend.partition import execute, partition


class Chains(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(8, 16, 3, padding=1), nn.Linear(16, 24)
        self.mish = nn.Mish()

    def forward(self, x, t):
        c = F.hardtanh(self.mish(self.conv(x)), -0.25, 1.5)  # fused into the conv
        c = torch.clamp(c ** 2, max=1.0) - torch.rsqrt(c.abs() + 1.0)
        y = self.fc(t)
        a = torch.exp(-y.square()) + torch.erf(y) + torch.sqrt(torch.abs(y))
        b = torch.maximum(y, -y) * torch.minimum(y, torch.full_like(y, 0.5)).clamp_min(-1.0)
        g = 0.5 * y * (1.0 + torch.tanh(0.79788456 * (y + 0.044715 * torch.pow(y, 3.0))))
        return c, a + b + y.pow(-1.0).clamp(-4.0, 4.0) + g + (y.abs() + 1.0) ** -5


def test_elementwise_ops_capture_fuse_and_compile():
    torch.manual_seed(0)
    model = Chains().eval()
    x, t = torch.randn(1, 8, 6, 6), torch.randn(1, 5, 16)
    graph = rk.capture(model, (x, t), strict=True)  # no island
    ops = {n.op for n in graph.nodes}
    assert {"mish", "exp", "erf", "sqrt", "rsqrt", "square", "neg", "abs", "maximum",
            "minimum"} <= ops
    tasks = partition(graph).tasks
    conv = next(t for t in tasks if t.compute.op == "conv2d")
    assert [e.op for e in conv.compute.epilogue][:4] == ["bias", "mish", "maximum", "minimum"]
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, (x, t))
    assert all(s.kind != "torch" for s in net.steps)
    x2, t2 = torch.randn(1, 8, 6, 6), torch.randn(1, 5, 16)
    with torch.no_grad():
        for got, want in zip(net(x2, t2), model(x2, t2)):
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fn", [lambda x: x ** 1.5, lambda x: x ** 17,
                                lambda x: torch.clamp(x, min=x.mean())])
def test_forms_without_a_lowering_are_islands(fn):
    class One(nn.Module):
        def forward(self, x):
            return fn(torch.relu(x))
    x = torch.randn(1, 4, 5)
    with pytest.raises(rk.UnsupportedOpError):
        rk.capture(One(), (x,), strict=True)


def test_addcmul_is_two_multiplications_and_an_addition():
    """ConvNeXt-V2's global response norm: x + addcmul(bias, weight, x * n)."""
    class Grn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 1)
            self.weight, self.bias = nn.Parameter(torch.randn(1, 8, 1, 1)), \
                nn.Parameter(torch.randn(1, 8, 1, 1))

        def forward(self, x):
            y = self.conv(x)
            return y + torch.addcmul(self.bias, self.weight, y * torch.sigmoid(y), value=0.5)

    model, x = Grn().eval(), torch.randn(1, 4, 6, 6)
    graph = rk.capture(model, (x,), strict=True)  # no island
    assert [n.op for n in graph.nodes].count("mul") == 3
    with torch.no_grad():
        assert torch.allclose(execute(partition(graph), [x])[0], model(x), atol=1e-5)


class InPlace(nn.Module):
    """In-place division and subtraction (ConViT's `attn /= attn.sum(-1)`); the shape test
    sends the capture through torch.export, whose graph keeps aten::div_ and aten::sub_ and
    feeds later uses from them."""

    def forward(self, x):
        y = torch.sigmoid(x) * 2
        if x.shape[0] > 0:
            y.div_(y.sum(dim=-1, keepdim=True))
            y.sub_(0.25)
        return y * x


def test_in_place_division_and_subtraction_from_an_export_are_ours():
    x = torch.randn(2, 3, 8)
    graph = rk.capture(InPlace(), (x,), strict=True)  # no island
    y = torch.randn(2, 3, 8)
    with torch.no_grad():
        want = InPlace()(y)
    assert torch.allclose(execute(partition(graph), [y])[0], want, atol=1e-6, rtol=1e-5)
