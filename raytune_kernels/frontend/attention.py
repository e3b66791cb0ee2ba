"""scaled_dot_product_attention as the ops it stands for, so attention runs in our kernels:
matmul(q, k^T) with the scale fused into its epilogue, the additive mask (a causal mask
is a constant of -inf above the diagonal), a row softmax, and matmul(p, v). A boolean
mask that is a constant becomes the same additive form; one computed at run time, dropout
and grouped-query attention are left to PyTorch (an island)."""
from __future__ import annotations

import math

import torch

from raytune_kernels.frontend.builder import Builder, Ctx, T, tensor_arg


def h_sdpa(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    q = tensor_arg(a["query"], ctx, "query")
    k = tensor_arg(a["key"], ctx, "key")
    v = tensor_arg(a["value"], ctx, "value")
    if a.get("dropout_p"):
        raise ctx.unsupported("attention dropout (call model.eval())")
    if a.get("enable_gqa") or q.value.shape[:-2] != k.value.shape[:-2]:
        raise ctx.unsupported("grouped-query attention (query and key heads differ)")
    scale = a.get("scale") or 1.0 / math.sqrt(q.value.shape[-1])
    dims = list(range(k.value.dim()))
    dims[-2], dims[-1] = dims[-1], dims[-2]
    kt_value = k.value.permute(dims)
    scores = q.value @ kt_value
    # every refusal comes before the first node: a refused call leaves nothing behind
    mask = _additive_mask(b, a.get("attn_mask"), bool(a.get("is_causal")), scores, ctx)
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
