"""Activations with a parameter and those written in terms of others (frontend/
activations.py): LeakyReLU, PReLU, RReLU, ELU, SELU, CELU, softplus, LogSigmoid, Softsign,
Tanhshrink, as nn modules, functions (torch.fx) and aten ops (torch.export): captured with
no island, fused into the kernel before them, compiled untuned and checked against
PyTorch on a new input."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network
from raytune_kernels.frontend.partition import partition


class Modules(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 6)
        self.acts = nn.Sequential(nn.LeakyReLU(0.2), nn.PReLU(8), nn.ELU(0.7), nn.SELU(),
                                  nn.CELU(0.5), nn.Softplus(2.0), nn.LogSigmoid(),
                                  nn.Softsign(), nn.Tanhshrink(), nn.RReLU(), nn.PReLU())
        self.head = nn.Sequential(nn.PReLU(6), nn.Softplus())

    def forward(self, x):
        y = self.acts(self.conv(x))
        return self.head(self.fc(y.mean((2, 3))))


class Functions(nn.Module):
    """The functional forms; `exported` adds control flow on a shape, so the model goes
    through torch.export and its calls reach the graph as aten ops."""

    def __init__(self, exported: bool = False):
        super().__init__()
        self.conv, self.exported = nn.Conv2d(3, 8, 3), exported
        self.slopes = nn.Parameter(torch.rand(8))

    def forward(self, x):
        if self.exported and x.shape[-1] > 4:
            x = x * 2.0
        y = F.leaky_relu(self.conv(x), 0.1)
        y = F.elu(F.prelu(y, self.slopes), 1.5) + F.selu(y) + F.celu(y, 2.0)
        return F.softplus(y, 0.5, 30.0) - F.logsigmoid(y) + F.softsign(y) + F.tanhshrink(y)


@pytest.mark.parametrize("model", [Modules(), Functions(), Functions(exported=True)],
                         ids=["modules", "functions", "aten"])
def test_activations_capture_with_no_island_fuse_and_compile(model):
    torch.manual_seed(0)
    model.eval()
    x = 3 * torch.randn(1, 3, 8, 8)
    graph = rk.capture(model, (x,), strict=True)  # no island
    assert {"prelu", "elu", "softplus"} <= {n.op for n in graph.nodes}
    conv = next(t for t in partition(graph).tasks if t.compute.op == "conv2d")
    assert "prelu" in [e.op for e in conv.compute.epilogue]  # fused into the conv
    net = compile_network(model, (x,), None, threads=1)
    y = 3 * torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        want = model(y)
        assert torch.allclose(net(y), want, atol=1e-5 * want.abs().max(), rtol=1e-5)


def test_a_softplus_threshold_where_it_differs_from_the_exact_one_is_refused():
    class Early(nn.Module):
        def forward(self, x):
            return F.softplus(x, threshold=2.0)

    with pytest.raises(rk.UnsupportedOpError, match="softplus with threshold 2.0"):
        rk.capture(Early(), (torch.randn(2, 4),), strict=True)
