"""PyTorch islands: an op without a node of ours runs in PyTorch inside the compiled
network, named in one warning; strict refuses it; values of constants are folded."""
import warnings

import pytest
import torch
import torch.nn as nn

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network
from raytune_kernels.frontend.island import ISLAND
from raytune_kernels.frontend.partition import execute, partition


class Unknowns(nn.Module):
    """Ops we have no node for (a module type, unknown functions and methods, one with two
    outputs) between convolutions of ours, chunk and indexing by a constant index buffer."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(8, 16, 1)
        self.act = nn.Softshrink()
        self.register_buffer("order", torch.arange(16).flip(0))  # int64: folded, not a param

    def forward(self, x):
        a, b = self.act(self.c1(x)).chunk(2, dim=1)
        z = torch.relu(self.c2(a)) + torch.cumprod(b, dim=2).flip(3).repeat(1, 2, 1, 1)
        values, where = torch.sort(z, dim=3)
        return values[:, self.order] + where  # both outputs of sort are read


def _capture(model, x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = rk.capture(model, (x,))
    return graph, [str(w.message) for w in caught if "PyTorch" in str(w.message)]


def test_unknown_ops_become_islands_named_in_one_warning():
    model, x = Unknowns().eval(), torch.randn(1, 3, 8, 8)
    graph, messages = _capture(model, x)
    assert len(messages) == 1
    for what in ("Softshrink in 'act'", "cumprod", "Tensor.flip", "sort"):
        assert what in messages[0], what
    islands = [n for n in graph.nodes if n.op == ISLAND]
    assert [n.attr("what") for n in islands].count("sort") == 2  # one node per output
    assert {n.op for n in graph.nodes} - {ISLAND} == {"conv2d", "relu", "add", "index",
                                                      "repeat"}
    assert "order" not in graph.params  # an int64 buffer is a constant, not a parameter
    with torch.no_grad():
        want = model(x)
    assert torch.equal(execute(partition(graph), [x])[0], want)


def test_strict_refuses_the_first_unknown_op_naming_it_and_its_layer():
    model, x = Unknowns().eval(), torch.randn(1, 3, 8, 8)
    with pytest.raises(rk.UnsupportedOpError, match="unsupported op 'Softshrink' in layer 'act'"):
        rk.extract_tasks(model, (x,), strict=True)


def test_a_network_with_islands_compiles_untuned_and_matches_eager():
    model, x = Unknowns().eval(), torch.randn(1, 3, 8, 8)
    with pytest.warns(UserWarning, match="run the analytic estimate's best config"):
        net = compile_network(model, (x,))  # no records at all
    kinds = [s.kind for s in net.steps]
    assert kinds.count("kernel") == 3 and kinds.count("torch") == 5
    y = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        assert torch.allclose(net(y), model(y), atol=1e-5, rtol=1e-5)


class IndexIsland(nn.Module):
    """An argmax (int64, glue of ours) read by indexing as an index: the float32 buffer
    between them round-trips the integers exactly."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(10, 4))

    def forward(self, x):
        idx = torch.argmax(x, dim=1)
        return torch.relu(self.table[idx])


def test_integer_values_cross_islands_exactly():
    model, x = IndexIsland().eval(), torch.randn(3, 10)
    net = compile_network(model, (x,), fallback="torch")
    y = torch.randn(3, 10)
    with torch.no_grad():
        assert torch.equal(net(y), model(y))


class ValueMask(nn.Module):
    def forward(self, x):
        return x[x > 0]


def test_a_shape_that_depends_on_values_is_still_refused():
    with pytest.raises(rk.DynamicShapeError, match="boolean mask"):
        rk.capture(ValueMask(), (torch.randn(4, 4),))


class MixedOutputs(nn.Module):
    """An unknown call whose outputs mix a plain number and tensors."""

    def forward(self, x):
        count, low, high = _mixed(x)
        return low * count + high


@torch.fx.wrap
def _mixed(x):
    if bool(x.sum() > 1e9):  # a branch on a value: no export, so it stays one island
        x = x + 1
    return 3, x.clamp(max=0), x.clamp(min=0).exp()


def test_each_island_output_is_the_leaf_it_names():
    x = torch.randn(2, 5)
    graph = rk.capture(MixedOutputs(), (x,))
    assert [n.op for n in graph.nodes].count(ISLAND) == 2
    assert torch.allclose(execute(partition(graph), [x])[0], MixedOutputs()(x))
