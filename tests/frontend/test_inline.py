"""Calls torch.fx keeps whole (torch.nn modules such as MultiheadAttention, functions
marked with torch.fx.wrap) are inlined from their export: their insides run in our
kernels, and only what has no handler inside stays in PyTorch."""
import warnings

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network
from raytune_kernels.frontend.island import ISLAND
from raytune_kernels.frontend.partition import execute, partition


class Encoder(nn.Module):
    """A transformer block written with nn.MultiheadAttention, as torchvision's ViT is."""

    def __init__(self, batch_first: bool, dim: int = 16, heads: int = 2):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=batch_first)
        self.mlp = nn.Sequential(nn.Linear(dim, 32), nn.GELU(), nn.Linear(32, dim))

    def forward(self, x):
        y = self.ln(x)
        y, _ = self.attn(y, y, y, need_weights=False)
        return self.mlp(x + y)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_is_inlined_into_our_ops(batch_first):
    torch.manual_seed(0)
    model, x = Encoder(batch_first).eval(), torch.randn(1, 10, 16)
    if not batch_first:
        x = x.transpose(0, 1).contiguous()
    graph = rk.capture(model, (x,), strict=True)  # no island
    ops = [n.op for n in graph.nodes]
    assert ops.count("matmul") == 2 and ops.count("softmax") == 1 and ops.count("dense") == 4
    layers = {n.layer for n in graph.nodes if n.op == "softmax"}
    assert layers == {"attn"}  # the inlined ops keep the module's layer name
    assert "attn.in_proj_weight" in graph.params
    with torch.no_grad():
        want = model(x)
    assert torch.allclose(execute(partition(graph), [x])[0], want, atol=1e-5, rtol=1e-5)


def test_inlined_attention_compiles_untuned_and_matches():
    torch.manual_seed(0)
    model, x = Encoder(True).eval(), torch.randn(1, 16, 16)
    with pytest.warns(UserWarning, match="untuned"):
        net = compile_network(model, (x,))
    assert all(s.kind != "torch" for s in net.steps)
    y = torch.randn(1, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net(y), model(y), atol=1e-4, rtol=1e-4)


@torch.fx.wrap
def window_mix(x: torch.Tensor, weight: torch.Tensor, window: int, shift: int):
    """Swin-like: pad to whole windows, shift, a mask built in place on a fresh tensor,
    attention inside each window, then back. fx keeps it as one call."""
    n, h, w, c = x.shape
    pad_h, pad_w = (window - h % window) % window, (window - w % window) % window
    x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    _, ph, pw, _ = x.shape  # unpacking a shape: symbolic tracing could not go through
    x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
    mask = x.new_zeros((ph, pw))
    mask[-shift:, :] = 1.0
    mask = mask.view(ph // window, window, pw // window, window).permute(0, 2, 1, 3)
    mask = mask.reshape(-1, window * window)
    mask = (mask.unsqueeze(1) - mask.unsqueeze(2)).masked_fill(mask.unsqueeze(1) != 0, -100.0)
    t = x.view(n, ph // window, window, pw // window, window, c).permute(0, 1, 3, 2, 4, 5)
    t = t.reshape(-1, window * window, c)
    q = F.linear(t, weight)
    a = torch.softmax(q @ t.transpose(1, 2) + mask, dim=-1) @ t
    a = a.view(n, ph // window, pw // window, window, window, c).permute(0, 1, 3, 2, 4, 5)
    a = torch.roll(a.reshape(n, ph, pw, c), shifts=(shift, shift), dims=(1, 2))
    return a[:, :h, :w, :].contiguous()


class Windows(nn.Module):
    def __init__(self, odd: bool = False):
        super().__init__()
        self.proj, self.odd = nn.Linear(8, 8), odd

    def forward(self, x):
        y = window_mix(self.proj(x), self.proj.weight, 3, 1)
        return torch.special.erfcx(y) if self.odd else y  # erfcx: an op we have no node for


def test_a_wrapped_function_is_inlined_with_its_constant_mask():
    torch.manual_seed(0)
    model, x = Windows().eval(), torch.randn(1, 7, 8, 8)
    graph = rk.capture(model, (x,), strict=True)
    ops = {n.op for n in graph.nodes}
    assert {"pad", "roll", "matmul", "softmax", "dense", "index"} <= ops
    with torch.no_grad():
        want = model(x)
    assert torch.allclose(execute(partition(graph), [x])[0], want, atol=1e-5, rtol=1e-5)


@torch.fx.wrap
def gated(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * torch.special.erfcx(x)  # erfcx: an op we have no node for


@torch.fx.wrap
def by_value(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if bool(x.sum() > 0) else x - 1  # control flow on a value: no export


class Partly(nn.Module):
    def forward(self, x):
        return by_value(gated(x))


def test_only_the_unknown_op_inside_stays_pytorch():
    model, x = Partly().eval(), torch.randn(1, 4, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = rk.capture(model, (x,))
    islands = [n.attr("what") for n in graph.nodes if n.op == ISLAND]
    assert islands == ["aten::special_erfcx", "by_value"]  # gated inlined, by_value not
    assert {"relu", "mul"} <= {n.op for n in graph.nodes}
    message = next(str(w.message) for w in caught if "PyTorch" in str(w.message))
    assert "by_value in 'by_value'" in message
    assert torch.allclose(execute(partition(graph), [x])[0], model(x))
    with pytest.raises(rk.UnsupportedOpError, match="'gated' in layer 'gated'"):
        rk.capture(model, (x,), strict=True)


class LinearAttention(nn.Module):
    """EfficientViT's ReLU linear attention: the division kept in float32 under a block
    with autocast off; the shape test sends the capture through torch.export."""

    def __init__(self, autocast: bool = False, dim: int = 16):
        super().__init__()
        self.qkv, self.autocast = nn.Linear(dim, 3 * dim), autocast

    def forward(self, x):
        q, k, v = F.relu(self.qkv(x)).chunk(3, dim=-1)
        if x.shape[1] > 1:
            v = F.pad(v, (0, 1), value=1.0)
        with torch.autocast(device_type="cpu", enabled=self.autocast):
            out = q @ (k.transpose(-1, -2) @ v)
            out = out[..., :-1] / (out[..., -1:] + 1e-5)
        return out.float() + x


def test_a_block_with_autocast_off_is_walked_into_our_ops():
    torch.manual_seed(0)
    model, x = LinearAttention().eval(), torch.randn(1, 12, 16)
    graph = rk.capture(model, (x,), strict=True)  # no island
    assert [n.op for n in graph.nodes].count("matmul") == 2
    y = torch.randn(1, 12, 16)
    with torch.no_grad():
        want = model(y)
    assert torch.allclose(execute(partition(graph), [y])[0], want, atol=1e-5, rtol=1e-5)


def test_a_block_with_autocast_on_stays_an_island():
    """Autocast on changes the dtypes inside the block: not ours to walk as float32."""
    torch.manual_seed(0)
    model, x = LinearAttention(autocast=True).eval(), torch.randn(1, 12, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = rk.capture(model, (x,))
    islands = [n.attr("what") for n in graph.nodes if n.op == ISLAND]
    assert islands[0] == "wrap_with_autocast" and [n.op for n in graph.nodes].count(
        "matmul") == 0
