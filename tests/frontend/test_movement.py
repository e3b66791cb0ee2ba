"""Data movement by constants (slices, pad, roll, expand, repeat, swapaxes, stack, indexing
by lists) as glue, and
two-operand einsum as permutes, reshapes and one batched matmul: captured with no island
and checked against PyTorch."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import raytune_kernels as rk
from raytune_kernels.frontend.partition import execute, partition


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _check(fn, *xs, want_ops=()):
    model = Fn(fn).eval()
    graph = rk.capture(model, xs, strict=True)  # strict: no island
    ops = {n.op for n in graph.nodes}
    assert set(want_ops) <= ops, ops
    with torch.no_grad():
        want = model(*xs)
    got = execute(partition(graph), list(xs))[0]
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    return graph


@pytest.mark.parametrize("fn, op", [
    (lambda x: F.pad(torch.relu(x), (1, 2, 0, 3), value=-0.5), "pad"),
    (lambda x: F.pad(torch.relu(x), (2, 1, 1, 2), mode="reflect"), "pad"),
    (lambda x: F.pad(torch.relu(x), (1, 1, 1, 1), mode="replicate"), "pad"),
    (lambda x: torch.constant_pad_nd(torch.relu(x), (1, 0, 2, 1), 0.25), "pad"),
    (lambda x: torch.roll(torch.relu(x), shifts=(-2, 3), dims=(2, 3)), "roll"),
    (lambda x: torch.relu(x).expand(2, 3, 6, 7), "expand"),
    (lambda x: torch.relu(x).repeat(1, 2, 1, 2), "repeat"),
    (lambda x: torch.relu(x)[:, 1:3, ::2, 1:-1], "index"),
    (lambda x: torch.relu(x).swapaxes(1, 3) + 1.0, "permute"),
    (lambda x: torch.stack((-x[..., 1::2], x[..., :6:2]), dim=-1).flatten(-2), "concat"),
    (lambda x: torch.relu(x)[:, [2, 0]], "index"),
])
def test_movement_ops_are_glue_and_match(fn, op):
    torch.manual_seed(0)
    _check(fn, torch.randn(1, 3, 6, 7), want_ops=[op])


@pytest.mark.parametrize("fn", [
    lambda x: torch.relu(x).unfold(2, 4, 2).unfold(3, 3, 2).flatten(-2),  # HaloNet's blocks
    lambda x: torch.relu(x).unfold(-1, 7, 1).sum(-1),  # one window, on the last dim
    lambda x: torch.relu(x).unfold(1, 2, 1),  # overlapping channel windows
])
def test_unfold_windows_are_slices_and_one_concat(fn):
    torch.manual_seed(0)
    _check(fn, torch.randn(1, 3, 6, 7), want_ops=["index"])


def test_unfold_through_export_and_too_many_windows():
    class Halo(nn.Module):
        def forward(self, x):
            if x.shape[-1] > 4:  # control flow on a shape: fx cannot trace it, export can
                x = x.unfold(2, 4, 2)
            return torch.relu(x)
    x = torch.randn(1, 2, 8, 6)
    graph = rk.capture(Halo(), (x,), strict=True)
    assert "concat" in {n.op for n in graph.nodes}
    assert torch.equal(execute(partition(graph), [x])[0], Halo()(x))
    with pytest.raises(rk.UnsupportedOpError, match="windows"):
        rk.capture(Fn(lambda x: x.unfold(-1, 1, 1) * 2), (torch.randn(1, 80),), strict=True)


def test_slices_through_export_are_glue():
    """x[..., a:b:c] reaches the graph as aten.slice when a model goes through export."""
    class Sliced(nn.Module):
        def forward(self, x):
            if x.shape[-1] > 4:  # control flow on a shape: fx cannot trace it, export can
                x = x[:, :, 1:5, ::2]
            return torch.relu(x)
    x = torch.randn(1, 2, 6, 6)
    graph = rk.capture(Sliced(), (x,), strict=True)
    assert "index" in {n.op for n in graph.nodes}
    assert torch.equal(execute(partition(graph), [x])[0], Sliced()(x))


def test_indexing_by_a_list_through_export_is_glue():
    """x[..., [i], :] (Falcon's multi-query key) reaches the graph as aten.index."""
    class Picked(nn.Module):
        def forward(self, x):
            if x.shape[-1] > 4:  # control flow on a shape: fx cannot trace it, export can
                x = x[..., [-2], :] * x[..., :-2, :]
            return x
    x = torch.randn(1, 3, 6, 8)
    graph = rk.capture(Picked(), (x,), strict=True)
    assert "index" in {n.op for n in graph.nodes}
    assert torch.equal(execute(partition(graph), [x])[0], Picked()(x))


def test_a_matmul_by_a_constant_matrix_is_a_dense_and_a_one_element_constant_a_scalar():
    """x @ W with W a parameter (Falcon's linear layers) is a dense, which has kernels for
    any leading dims; x * torch.tensor(c) (Gemma's embedding scale) multiplies by c."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 12))

        def forward(self, x):
            return (x @ self.w) * torch.tensor(3.0)
    model, x = Scaled(), torch.randn(1, 5, 8)
    graph = rk.capture(model, (x,), strict=True)
    assert [(n.op, n.attr("scalar")) for n in graph.nodes] == [("dense", None), ("mul", 3.0)]
    with torch.no_grad():
        assert torch.allclose(execute(partition(graph), [x])[0], model(x), atol=1e-5)


def test_baddbmm_and_a_run_time_value_broadcast_against_a_constant():
    """WavLM's attention: baddbmm(bias, q, k^T, beta, alpha) is a matmul with the scale
    and the addition in its epilogue; a run-time gate (4, 1) times a constant of the full
    shape (4, 5) expands the gate first (glue), so the task reads a run-time value."""
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.randn(2, 4, 5))

        def forward(self, q, k, g):
            s = torch.baddbmm(self.bias, q, k.transpose(1, 2), beta=0.5, alpha=0.25)
            return s + torch.sigmoid(g) * self.bias[0]

    model = Attention()
    xs = (torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(4, 1))
    graph = rk.capture(model, xs, strict=True)
    assert {"matmul", "expand"} <= {n.op for n in graph.nodes}
    with torch.no_grad():
        assert torch.allclose(execute(partition(graph), list(xs))[0], model(*xs), atol=1e-5)


@pytest.mark.parametrize("equation, shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhid,bhjd->bhij", [(1, 2, 5, 8), (1, 2, 6, 8)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("b i d, d e -> b e i", [(2, 3, 4), (4, 5)]),
    ("nchw,cd->ndhw", [(1, 4, 3, 3), (4, 6)]),
    ("ij,j->i", [(3, 4), (4,)]),
])
def test_einsum_of_two_operands_is_one_matmul(equation, shapes):
    torch.manual_seed(0)
    xs = [torch.randn(s) for s in shapes]
    graph = _check(lambda a, b: torch.einsum(equation, a, b), *xs, want_ops=["matmul"])
    assert [n.op for n in graph.nodes].count("matmul") == 1


@pytest.mark.parametrize("equation, shapes", [
    ("ii,ij->j", [(3, 3), (3, 4)]),  # a diagonal
    ("ij,kl->i", [(3, 4), (5, 6)]),  # sums indices of one operand alone
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),  # three operands
])
def test_einsum_forms_without_a_lowering_are_islands_strict_refuses(equation, shapes):
    xs = [torch.randn(s) for s in shapes]
    model = Fn(lambda *t: torch.einsum(equation, *t)).eval()
    with pytest.raises(rk.UnsupportedOpError, match="einsum"):
        rk.capture(model, xs, strict=True)
    with pytest.warns(UserWarning, match="einsum"):
        graph = rk.capture(model, xs)
    assert torch.allclose(execute(partition(graph), xs)[0], model(*xs), atol=1e-5)


@pytest.mark.parametrize("shape, kernel, stride, padding", [
    ((1, 8, 14, 14), 3, 2, 0),  # GoogLeNet's: the last window hangs off by one
    ((1, 8, 13, 11), 3, 2, 1),
    ((1, 8, 12, 12), 2, 2, 0),  # ceil_mode that changes nothing
])
def test_ceil_mode_max_pooling_is_padding_and_an_ordinary_pool(shape, kernel, stride, padding):
    pool = nn.MaxPool2d(kernel, stride, padding, ceil_mode=True)
    graph = _check(lambda x: pool(torch.relu(x)), torch.randn(shape), want_ops=["max_pool2d"])
    assert all(not n.attr("ceil_mode") for n in graph.nodes if n.op == "max_pool2d")
    tasks = partition(graph).tasks
    from raytune_kernels.cpu.machine import cpu_info
    from raytune_kernels.cpu.schedules import no_kernel_reason
    pools = [t for t in tasks if t.compute.op == "max_pool2d"]
    assert pools and no_kernel_reason(pools[0].compute, cpu_info()) is None


def _permutes(graph):
    return [n for n in graph.nodes if n.op == "permute"]


def test_a_permute_of_a_permute_is_one_copy():
    """Attention's keys: split into heads, then transposed for Q K^T: one permute of the
    first's input, composed, where the first is read by nothing else."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 4)
    graph = _check(lambda x: torch.relu(x).transpose(1, 2).transpose(-1, -2) * 2.0, x)
    (p,) = _permutes(graph)
    assert p.attr("dims") == (0, 2, 3, 1)
    graph = _check(lambda x: torch.relu(x).permute(1, 0, 2, 3).permute(0, 2, 1, 3)
                   .permute(3, 2, 1, 0) - 1.0, x)  # a chain of three
    (p,) = _permutes(graph)
    assert p.attr("dims") == (3, 0, 2, 1)


def test_a_permute_read_twice_or_undone_is_kept_or_dropped_as_it_must_be():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 4)
    # the first permute has a reader of its own: both copies stay
    graph = _check(lambda x: (lambda t: t.transpose(-1, -2).reshape(2, 3, 20) +
                              t.reshape(2, 3, 20))(torch.relu(x).transpose(1, 2)), x)
    assert len(_permutes(graph)) == 2
    # a chain that undoes itself is no copy at all
    graph = _check(lambda x: torch.relu(x).transpose(1, 2).transpose(1, 2) + 1.0, x)
    assert _permutes(graph) == []
    # ... unless its end is what the model returns
    graph = _check(lambda x: torch.relu(x).transpose(1, 2).transpose(1, 2), x)
    (p,) = _permutes(graph)
    assert p.attr("dims") == (0, 1, 2, 3)
