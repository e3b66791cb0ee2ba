"""Group norm, instance norm and resizing (interpolate, nn.Upsample) run our kernels: group
and instance norm as row reductions and elementwise tasks, nearest resizing by whole
factors as an expand, every other separable mode as two denses by PyTorch's own
resampling matrices; each checked against PyTorch through an untuned compile."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.gn, self.inn = nn.GroupNorm(2, 8), nn.InstanceNorm2d(8, affine=True)
        self.plain = nn.InstanceNorm2d(8)
        for p in (self.gn.weight, self.gn.bias, self.inn.weight, self.inn.bias):
            nn.init.normal_(p)

    def forward(self, x):
        y = self.conv(x)
        return self.gn(y), self.inn(y), self.plain(y) * 2.0, F.group_norm(y, 4, eps=1e-3)


RESIZES = [
    lambda y: F.interpolate(y, scale_factor=2, mode="nearest"),
    lambda y: nn.Upsample(scale_factor=2, mode="bilinear")(y),
    lambda y: F.interpolate(y, size=(13, 7), mode="bilinear", align_corners=True),
    lambda y: F.interpolate(y, size=(9, 8), mode="nearest"),
    lambda y: F.interpolate(y, scale_factor=(1.5, 2.0), mode="bicubic"),
    lambda y: F.interpolate(y, size=(3, 2), mode="area"),
    # 6 -> 18 rows by a factor of 3.1: a whole ratio, but not repeated rows
    lambda y: F.interpolate(y, scale_factor=(3.1, 1.0), mode="nearest"),
]


class Resize(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.conv, self.fn = nn.Conv2d(8, 8, 3, padding=1), fn

    def forward(self, x):
        return torch.relu(self.fn(self.conv(x)))


def _compiled_matches(model, x):
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, (x,))
    assert all(s.kind != "torch" for s in net.steps), [s.name for s in net.steps
                                                       if s.kind == "torch"]
    x2 = torch.randn_like(x)
    with torch.no_grad():
        got, want = net(x2), model(x2)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        assert g.shape == w.shape and torch.allclose(g, w, atol=1e-4, rtol=1e-4)


def test_group_and_instance_norm_run_our_kernels():
    torch.manual_seed(0)
    model, x = Norms().eval(), torch.randn(1, 8, 6, 5)
    graph = rk.capture(model, (x,), strict=True)
    assert sum(n.op == "reduce" for n in graph.nodes) == 8  # mean and variance, 4 norms
    _compiled_matches(model, x)


@pytest.mark.parametrize("i", range(len(RESIZES)))
def test_resizing_runs_our_kernels(i):
    torch.manual_seed(i)
    model, x = Resize(RESIZES[i]).eval(), torch.randn(1, 8, 6, 5)
    ops = {n.op for n in rk.capture(model, (x,), strict=True).nodes}
    assert ("expand" in ops) == (i == 0) and ("dense" in ops) == (i != 0)
    _compiled_matches(model, x)


def test_antialiased_resizing_is_refused_by_strict():
    model = Resize(lambda y: F.interpolate(y, size=(3, 2), mode="bilinear", antialias=True))
    with pytest.raises(rk.UnsupportedOpError, match="antialias"):
        rk.capture(model.eval(), (torch.randn(1, 8, 6, 5),), strict=True)


class Masked(nn.Module):
    """where / masked_fill by constant masks: an infinite fill (attention) and finite ones."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.register_buffer("upper", torch.ones(6, 6, dtype=torch.bool).triu(1))

    def forward(self, x):
        s = self.fc(x)
        causal = torch.softmax(s.masked_fill(self.upper, float("-inf")), dim=-1)
        kept = torch.where(self.upper, s, 0.5)        # the fill where the mask is False
        swapped = torch.where(~self.upper, -2.0, s)   # the fill where the mask is True
        return causal, kept * swapped


def test_where_and_masked_fill_by_constant_masks_run_our_kernels():
    torch.manual_seed(0)
    model, x = Masked().eval(), torch.randn(1, 6, 6)
    ops = {n.op for n in rk.capture(model, (x,), strict=True).nodes}
    assert "torch" not in ops
    _compiled_matches(model, x)


def test_where_on_a_run_time_condition_is_an_island():
    class RunTime(nn.Module):
        def forward(self, x):
            return torch.where(x > 0, x, 0.1 * x)
    with pytest.warns(UserWarning, match="where"):
        graph = rk.capture(RunTime(), (torch.randn(1, 4, 8),))
    # the comparison is our glue; the choice on it stays PyTorch's
    assert [n.attr("what") for n in graph.nodes if n.op == "torch"] == ["where"]
    assert [n.op for n in graph.nodes if n.op != "torch"] == ["compare", "mul"]
