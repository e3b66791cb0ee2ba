"""Reductions over any dims (sum, mean, amax, amin, vector norms): captured as "reduce" row
tasks over the last axis (the reduced dims moved last), their elementwise followers fused
into the reduction where they keep its shape, and checked against PyTorch through an
untuned compile on new inputs, with no PyTorch step left."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network
from raytune_kernels.frontend.partition import partition


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Reductions(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(24, 32), RMSNorm(32)

    def forward(self, t, img):
        h = self.norm(self.fc(t))                      # (1, 7, 32)
        pooled = h.mean(dim=1)                         # token mean: dims moved last
        peak = torch.amax(img, dim=(2, 3)) - img.amin(dim=(1, 3)).sum(-1, keepdim=True)
        unit = F.normalize(h, dim=-1)                  # 2-norm, clamp_min, divide
        return pooled, peak, unit, img.sum(), torch.linalg.vector_norm(img, ord=1, dim=1)


def test_reductions_capture_as_row_tasks_and_match_pytorch():
    torch.manual_seed(0)
    model = Reductions().eval()
    t, img = torch.randn(1, 7, 24), torch.randn(1, 6, 5, 9)
    graph = rk.capture(model, (t, img), strict=True)  # no island
    tasks = partition(graph).tasks
    kinds = sorted(t.compute.attr("kind") for t in tasks if t.compute.op == "reduce")
    assert kinds == ["max", "mean", "mean", "min", "sum", "sum", "sum", "sum"]
    rms = next(t for t in tasks if t.compute.op == "reduce" and t.compute.epilogue)
    assert [e.op for e in rms.compute.epilogue] == ["add", "rsqrt"]  # fused into the mean
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, (t, img))
    assert all(s.kind != "torch" for s in net.steps)
    t2, img2 = torch.randn(1, 7, 24), torch.randn(1, 6, 5, 9) * 3
    with torch.no_grad():
        for got, want in zip(net(t2, img2), model(t2, img2)):
            assert got.shape == want.shape
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fn", [lambda x: x.sum(1, dtype=torch.float64).float(),
                                lambda x: torch.norm(x, p=3, dim=1)])
def test_reductions_without_a_lowering_are_refused_by_strict(fn):
    class One(nn.Module):
        def forward(self, x):
            return fn(torch.relu(x))
    with pytest.raises(rk.UnsupportedOpError):
        rk.capture(One(), (torch.randn(1, 4, 5),), strict=True)
