"""scaled_dot_product_attention as the ops it stands for, so attention runs in our kernels:
matmul(q, k^T) with the scale fused into its epilogue, the additive mask (a causal mask
is a constant of -inf above the diagonal), a row softmax, and matmul(p, v). A boolean
mask that is a constant becomes the same additive form; one computed at run time and
dropout are left to PyTorch (an island). Grouped-query and multi-query attention (fewer
key/value heads than query heads, with enable_gqa or one key/value head broadcast) repeat
each key/value head for its group of query heads (glue), as Hugging Face's repeat_kv."""
from __future__ import annotations

import math

import torch

from raytune_kernels.frontend.builder import Builder, Ctx, T, tensor_arg


def sdpa_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    q = tensor_arg(a["query"], ctx, "query")
    k = tensor_arg(a["key"], ctx, "key")
    v = tensor_arg(a["value"], ctx, "value")
    if a.get("dropout_p"):
        raise ctx.unsupported("attention dropout (call model.eval())")
    groups = _groups(q.value, k.value, bool(a.get("enable_gqa")), ctx)
    scale = a.get("scale") or 1.0 / math.sqrt(q.value.shape[-1])
    dims = list(range(k.value.dim()))
    dims[-2], dims[-1] = dims[-1], dims[-2]
    kt_value = k.value.repeat_interleave(groups, -3).permute(dims)
    scores = q.value @ kt_value
    # every refusal comes before the first node: a refused call leaves nothing behind
    mask = _additive_mask(b, a.get("attn_mask"), bool(a.get("is_causal")), scores, ctx)
    if groups > 1:
        k, v = _repeat_heads(b, k, groups, ctx), _repeat_heads(b, v, groups, ctx)
    kt = b.node("permute", [k], {"dims": tuple(dims)}, kt_value, ctx)
    s = b.node("matmul", [q, kt], {}, scores, ctx)
    scores = scores * scale
    s = b.node("mul", [s], {"scalar": float(scale), "reverse": False}, scores, ctx)
    if mask is not None:
        scores = scores + mask.value
        s = b.node("add", [s, mask], {}, scores, ctx)
    probs = torch.softmax(scores, dim=-1)
    p = b.node("softmax", [s], {"dim": scores.dim() - 1}, probs, ctx)
    return b.node("matmul", [p, v], {}, out, ctx)


def _groups(q: torch.Tensor, k: torch.Tensor, gqa: bool, ctx: Ctx) -> int:
    """How many query heads share each key/value head (1 when their shapes agree)."""
    if q.shape[:-2] == k.shape[:-2]:
        return 1
    if q.dim() < 3 or q.shape[:-3] != k.shape[:-3] or q.shape[-3] % k.shape[-3] or \
            not (gqa or k.shape[-3] == 1):
        raise ctx.unsupported(f"attention of query heads {tuple(q.shape[:-2])} to key "
                              f"heads {tuple(k.shape[:-2])}")
    return q.shape[-3] // k.shape[-3]


def _repeat_heads(b: Builder, x: T, groups: int, ctx: Ctx) -> T:
    """Each head of x (..., H, S, D) repeated `groups` times in a row: a reshape to
    (..., H, 1, S, D), an expand to (..., H, groups, S, D), a reshape to (..., H*groups,
    S, D) (glue)."""
    v = x.value
    one = v.unsqueeze(-3)
    wide = one.expand(*v.shape[:-2], groups, *v.shape[-2:])
    out = v.repeat_interleave(groups, -3)
    y = b.node("reshape", [x], {"shape": tuple(one.shape)}, one, ctx)
    y = b.node("expand", [y], {"shape": tuple(wide.shape)}, wide, ctx)
    return b.node("reshape", [y], {"shape": tuple(out.shape)}, out, ctx)


def scores_mask_at_full_shape(b: Builder, x: T, y: T, out: torch.Tensor) -> tuple:
    """x and y, a constant mask shared by every head (1, 1, S, S) added to or multiplying
    attention scores computed outside SDPA (eager attention: Gemma2's soft-capped scores)
    stored at the scores' full shape, as SDPA's masks are: the matmul's epilogue then
    reads it like its output. Scores are a matmul's output, or elementwise ops on one."""
    mask, scores = (x, y) if x.ref in b.params else (y, x)
    if mask.ref not in b.params or scores.ref in b.params or out.dim() < 3 or \
            scores.value.shape != out.shape or mask.value.shape == out.shape or \
            tuple(mask.value.shape[-2:]) != tuple(out.shape[-2:]) or not _from_matmul(b, scores):
        return x, y
    name = f"{mask.ref}_at_{'x'.join(str(d) for d in out.shape)}"
    full = T(name, b.params[name]) if name in b.params else \
        b.param(name, mask.value.expand(out.shape).contiguous())
    return (full, y) if mask is x else (x, full)


def _from_matmul(b: Builder, v: T) -> bool:
    """Whether `v` is a matmul's output, or an elementwise op on one, back along first
    inputs."""
    producer = {n.name: n for n in b.nodes}
    node = producer.get(v.ref)
    while node is not None and node.op in ("mul", "div", "add", "sub", "tanh"):
        node = producer.get(node.inputs[0])
    return node is not None and node.op == "matmul"


def _additive_mask(b: Builder, mask, causal: bool, scores: torch.Tensor, ctx: Ctx
                   ) -> T | None:
    """The mask as a tensor added to the scores; None without one. A constant mask is
    stored at the scores' full shape, which every epilogue reads like its output."""
    if causal and mask is not None:
        raise ctx.unsupported("attention with both is_causal and attn_mask")
    length, source = scores.shape[-2], scores.shape[-1]
    if causal:
        keep = torch.ones(length, source, dtype=torch.bool).tril()
        return b.param(b.unique(f"{ctx.layer}.causal_mask"),
                       _bool_to_additive(keep).expand(scores.shape).contiguous())
    if mask is None:
        return None
    if isinstance(mask, T) and mask.ref not in b.params:
        if mask.value.dtype == torch.bool:
            raise ctx.unsupported("a boolean attention mask computed at run time")
        return mask
    value = mask.value if isinstance(mask, T) else mask
    additive = _bool_to_additive(value) if value.dtype == torch.bool else value.float()
    return b.param(b.unique(f"{ctx.layer}.mask"), additive.expand(scores.shape).contiguous())


def _bool_to_additive(keep: torch.Tensor) -> torch.Tensor:
    return torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
