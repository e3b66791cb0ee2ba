"""scaled_dot_product_attention captured as matmul, scale, mask, softmax and matmul: our
kernels, checked against PyTorch's own attention."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import raytune_kernels as rk
from raytune_kernels.compile.api import compile_network
from raytune_kernels.frontend.partition import execute, partition


class Attention(nn.Module):
    def __init__(self, mask: str = "none", heads: int = 2, dim: int = 16, length: int = 8):
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.heads, self.mask = heads, mask
        if mask == "float":
            self.register_buffer("bias", torch.randn(1, 1, 1, length))
        if mask == "bool":
            self.register_buffer("keep", torch.rand(length, length) > 0.3)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4).unbind(0)
        mask = {"none": None, "causal": None, "float": getattr(self, "bias", None),
                "bool": getattr(self, "keep", None)}[self.mask]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           is_causal=self.mask == "causal")
        return self.proj(y.transpose(1, 2).reshape(n, t, d))


@pytest.mark.parametrize("mask", ["none", "causal", "float", "bool"])
def test_attention_is_captured_as_our_ops_and_matches_pytorch(mask):
    torch.manual_seed(0)
    model, x = Attention(mask).eval(), torch.randn(1, 8, 16)
    graph = rk.capture(model, (x,), strict=True)  # no island
    ops = [n.op for n in graph.nodes]
    assert ops.count("matmul") == 2 and "softmax" in ops
    with torch.no_grad():
        want = model(x)
    assert torch.allclose(execute(partition(graph), [x])[0], want, atol=1e-5, rtol=1e-5)


def test_attention_compiles_untuned_and_matches():
    torch.manual_seed(0)
    model, x = Attention("causal").eval(), torch.randn(1, 8, 16)
    net = compile_network(model, (x,))
    assert any(s.kind == "kernel" and "matmul" in (s.key and
               next(t for t in net.part.tasks if t.key == s.key).compute.op)
               for s in net.steps)
    y = torch.randn(1, 8, 16)
    with torch.no_grad():
        assert torch.allclose(net(y), model(y), atol=1e-5, rtol=1e-4)


def test_a_boolean_mask_computed_at_run_time_stays_pytorchs():
    class Computed(nn.Module):
        def forward(self, q):
            return F.scaled_dot_product_attention(q, q, q, attn_mask=q[..., :1] > 0)

    q = torch.randn(1, 2, 4, 8)
    with pytest.warns(UserWarning, match="scaled_dot_product_attention"):
        graph = rk.capture(Computed(), (q,))
    # the mask is our glue (a comparison); the attention on it stays PyTorch's
    assert [n.op for n in graph.nodes] == ["index", "compare", "torch"]
    assert torch.allclose(execute(partition(graph), [q])[0], Computed()(q), equal_nan=True)


@pytest.mark.parametrize("kv_heads, gqa", [(2, True), (1, False), (1, True)])
def test_grouped_and_multi_query_attention_repeat_key_heads_with_no_island(kv_heads, gqa):
    """Fewer key/value heads than query heads: enable_gqa (Llama's through SDPA) or one
    head broadcast (Falcon's multi-query); each key/value head serves its group."""
    class Grouped(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, kv_heads, 8, 16), \
        torch.randn(1, kv_heads, 8, 16)
    graph = rk.capture(Grouped(), (q, k, v), strict=True)
    assert [n.op for n in graph.nodes].count("expand") == 2
    got = execute(partition(graph), [q, k, v])[0]
    assert torch.allclose(got, Grouped()(q, k, v), atol=1e-5, rtol=1e-5)



def test_an_eager_attention_mask_shared_by_every_head_is_read_at_the_scores_shape():
    """Eager attention (Gemma2's, soft-capped) adds a causal mask of (1, 1, S, S) to the
    scores of every head: it is stored at the scores' shape, so the matmul's epilogue
    reads it like its output and the compiled network runs no PyTorch kernel."""
    class Eager(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.full((8, 8), float("-inf")).triu(1)[None, None])

        def forward(self, q, k, v):
            s = torch.tanh((q @ k.transpose(-1, -2)) * 0.25 / 5.0) * 5.0 + self.mask
            return torch.softmax(s, dim=-1) @ v

    q, k, v = (torch.randn(1, 4, 8, 16) for _ in range(3))
    graph = rk.capture(Eager(), (q, k, v), strict=True)
    scores = next(t.compute for t in partition(graph).tasks if t.compute.op == "matmul")
    assert scores.epilogue[-1].op == "add" and \
        scores.epilogue[-1].operands[0].shape == (1, 4, 8, 8)
    net = compile_network(Eager(), (q, k, v), None, threads=1)
    assert all(s.kind != "torch" for s in net.steps)
    with torch.no_grad():
        assert torch.allclose(net(q, k, v), Eager()(q, k, v), atol=1e-5)
