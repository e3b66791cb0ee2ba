"""Translation of captured torch calls into Graph IR nodes.

torch.fx gives torch-level calls (F.conv2d, Tensor.view, nn.Conv2d modules); torch.export
gives aten calls (aten.conv2d.default). Both are bound to one small signature per op, so a
single handler per op turns either into a node.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
import torch.nn.functional as F

from raytune_kernels.errors import DynamicShapeError
from raytune_kernels.frontend.builder import Builder, Ctx, T, need_param, norm_dim, pair, tensor_arg
from raytune_kernels.frontend.activations import FUNCTIONS as ACTIVATIONS
from raytune_kernels.frontend.attention import scores_mask_at_full_shape, sdpa_handler
from raytune_kernels.frontend.conv1d import conv1d_handler
from raytune_kernels.frontend.integers import (COMPARE_FNS, argmax_handler, cast_handler,
                                               compare_handler, cumsum_handler, gather_handler)
from raytune_kernels.frontend.reference import REDUCE_FNS
from raytune_kernels.frontend.movement import (einsum_handler, expand_handler, pad_handler,
                                               roll_handler, slice_handler, stack_handler,
                                               unfold_handler)
from raytune_kernels.frontend.slicing import (getitem_handler, index_handler, select_handler,
                                              split_handler, unbind_handler)


# ---- signatures: one stub per calling convention; binding normalises args/kwargs ----

def _conv2d_stub(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1): ...
def _linear_stub(input, weight, bias=None): ...
def _add_sub_stub(input, other, alpha=1): ...
def _mul_stub(input, other): ...
def _div_stub(input, other, rounding_mode=None): ...
def _unary_stub(input, inplace=False): ...
def _gelu_stub(input, approximate="none"): ...
def _hardtanh_stub(input, min_val=-1.0, max_val=1.0, inplace=False): ...
def _batch_norm_stub(input, running_mean, running_var, weight=None, bias=None, training=False,
                     momentum=0.1, eps=1e-5): ...
def _batch_norm_aten_stub(input, weight, bias, running_mean, running_var, training, momentum, eps,
                          cudnn_enabled=True): ...
def _max_pool_stub(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                   return_indices=False): ...
def _avg_pool_stub(input, kernel_size, stride=None, padding=0, ceil_mode=False,
                   count_include_pad=True, divisor_override=None): ...
def _adaptive_avg_pool_stub(input, output_size): ...
def _softmax_stub(input, dim=None, _stacklevel=3, dtype=None): ...
def _softmax_aten_stub(input, dim, half_to_float=False): ...
def _layer_norm_stub(input, normalized_shape, weight=None, bias=None, eps=1e-5,
                     cudnn_enable=True): ...
def _matmul_stub(input, other): ...
def _cat_stub(tensors, dim=0): ...
def _transpose_stub(input, dim0, dim1): ...
def _permute_stub(input, *dims): ...
def _any_stub(input, *args, **kwargs): ...
def _dropout_stub(input, p=0.5, training=False, inplace=False): ...
def _stochastic_depth_stub(input, p, mode, training=True): ...
def _mean_stub(input, dim=None, keepdim=False, dtype=None): ...
def _amax_stub(input, dim=(), keepdim=False): ...
def _where_stub(condition, input, other): ...
def _masked_fill_stub(input, mask, value): ...
def _group_norm_stub(input, num_groups, weight=None, bias=None, eps=1e-5): ...
def _group_norm_aten_stub(input, num_groups, weight=None, bias=None, eps=1e-5,
                          cudnn_enabled=True): ...
def _instance_norm_stub(input, running_mean=None, running_var=None, weight=None, bias=None,
                        use_input_stats=True, momentum=0.1, eps=1e-5): ...
def _interpolate_stub(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                      recompute_scale_factor=None, antialias=False): ...
def _norm_stub(input, p="fro", dim=None, keepdim=False, dtype=None): ...
def _vector_norm_stub(input, ord=2, dim=None, keepdim=False, dtype=None): ...
def _getitem_stub(input, index): ...
def _split_stub(input, split, dim=0): ...
def _unbind_stub(input, dim=0): ...
def _select_stub(input, dim, index): ...
def _addmm_stub(input, mat1, mat2, *, beta=1, alpha=1): ...
def _addcmul_stub(input, tensor1, tensor2, *, value=1): ...
def _sdpa_stub(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False): ...
def _embedding_stub(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
                    scale_grad_by_freq=False, sparse=False): ...
def _pow_stub(input, exponent): ...
def _clamp_stub(input, min=None, max=None): ...
def _clamp_min_stub(input, min): ...
def _clamp_max_stub(input, max): ...
def _binary_stub(input, other): ...
def _slice_stub(input, dim=0, start=None, end=None, step=1): ...
def _pad_stub(input, pad, mode="constant", value=None): ...
def _constant_pad_stub(input, pad, value=0.0, mode="constant"): ...
def _roll_stub(input, shifts, dims=None): ...
def _unfold_stub(input, dimension, size, step): ...
def _einsum_stub(equation, *operands, path=None): ...
def _embedding_aten_stub(weight, indices, padding_idx=-1, scale_grad_by_freq=False,
                         sparse=False): ...
def _cumsum_stub(input, dim, dtype=None): ...
def _index_stub(input, indices): ...
def _gather_stub(input, dim, index, sparse_grad=False): ...
def _argmax_stub(input, dim=None, keepdim=False): ...


# ---- helpers ----


def _conv_padding(padding: Any, weight: torch.Tensor, dilation: tuple, ctx: Ctx) -> tuple:
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        totals = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
        if any(t % 2 for t in totals):
            raise ctx.unsupported("padding='same' with an even kernel pads asymmetrically")
        return tuple(t // 2 for t in totals)
    return pair(padding)


# ---- handlers: (builder, bound args, concrete output, ctx) -> T ----

def conv2d_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x, w = tensor_arg(a["input"], ctx), need_param(b, a["weight"], ctx, "weight")
    if x.value.dim() != 4:
        raise ctx.unsupported(f"conv2d on a {x.value.dim()}-D input (batched NCHW only)")
    dilation = pair(a["dilation"])
    attrs = {"stride": pair(a["stride"]), "dilation": dilation, "groups": int(a["groups"]),
             "padding": _conv_padding(a["padding"], w.value, dilation, ctx)}
    ins = [x, w] + ([need_param(b, a["bias"], ctx, "bias")] if a["bias"] is not None else [])
    return b.node("conv2d", ins, attrs, out, ctx)


def dense_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x, w = tensor_arg(a["input"], ctx), need_param(b, a["weight"], ctx, "weight")
    ins = [x, w] + ([need_param(b, a["bias"], ctx, "bias")] if a["bias"] is not None else [])
    return b.node("dense", ins, {}, out, ctx)


def matmul_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x, y = tensor_arg(a["input"], ctx), tensor_arg(a["other"], ctx, "other")
    if x.value.dim() < 2 or y.value.dim() < 2:
        raise ctx.unsupported("matmul with a 1-D operand (reshape it to 2-D)")
    return _product(b, x, y, out, ctx)


def _product(b: Builder, x: T, y: T, out: torch.Tensor, ctx: Ctx) -> T:
    """x @ y: a dense where y is a 2-D parameter (Falcon's x @ W, GPT-2's addmm), whose
    weights are packed once into the panels a dense reads (a matmul reads y as it lies:
    GPT-2's 768x3072 and 3072x768 weights by rows 12 KiB apart; untuned GPT2Model ran 2.65x
    faster with them as denses), else a matmul."""
    if y.ref in b.params and y.value.dim() == 2:
        w = b.param(b.unique(f"{ctx.layer}.weight_t"), y.value.T.contiguous())
        return b.node("dense", [x, w], {}, out, ctx)
    return b.node("matmul", [x, y], {}, out, ctx)


def _affine(b: Builder, x: T, mean, var, weight, bias, eps: float, out, ctx: Ctx) -> T:
    scale = (weight if weight is not None else torch.ones_like(var)) / torch.sqrt(var + eps)
    shift = (bias if bias is not None else torch.zeros_like(mean)) - mean * scale
    s = b.param(f"{ctx.layer}.scale", scale.float())
    t = b.param(f"{ctx.layer}.shift", shift.float())
    return b.node("affine", [x, s, t], {"axis": 1}, out, ctx)


def batch_norm_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    if a["training"]:
        raise ctx.unsupported("batch norm in training mode (call model.eval())")
    val = lambda k: a[k].value if isinstance(a[k], T) else a[k]  # noqa: E731
    if val("running_mean") is None:
        raise ctx.unsupported("batch norm without running statistics")
    return _affine(b, tensor_arg(a["input"], ctx), val("running_mean"), val("running_var"),
                   val("weight"), val("bias"), float(a["eps"]), out, ctx)


def unary(op: str) -> Callable:
    def handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
        return b.node(op, [tensor_arg(a["input"], ctx)], {}, out, ctx)
    return handler


def gelu_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    op = {"none": "gelu", "tanh": "gelu_tanh"}[a["approximate"]]
    return b.node(op, [tensor_arg(a["input"], ctx)], {}, out, ctx)


def hardtanh_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    return clamp_handler(b, {"input": a["input"], "min": a["min_val"], "max": a["max_val"]}, out,
                         ctx)


def _scalar(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def binary(op: str) -> Callable:
    def handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
        if a.get("alpha", 1) != 1 or a.get("rounding_mode") is not None:
            raise ctx.unsupported("alpha or rounding_mode arguments")
        x, y = a["input"], a["other"]
        x, y = _one_value(b, x, y, out), _one_value(b, y, x, out)
        if isinstance(x, T) and isinstance(y, T):
            x, y = _run_time_at_full_shape(b, x, y, out, ctx)
            x, y = scores_mask_at_full_shape(b, x, y, out)
            return b.node(op, [x, y], {}, out, ctx)
        tensor, const, reverse = (x, y, False) if isinstance(x, T) else (y, x, True)
        if _scalar(const) is None:
            raise ctx.unsupported(f"operand of type {type(const).__name__}")
        attrs = {"scalar": _scalar(const), "reverse": reverse and op in ("sub", "div")}
        return b.node(op, [tensor_arg(tensor, ctx)], attrs, out, ctx)
    return handler


def _run_time_at_full_shape(b: Builder, x: T, y: T, out: torch.Tensor, ctx: Ctx) -> tuple:
    """x and y, a run-time one expanded (glue) where only a constant has the result's
    shape (WavLM's gated position bias): the task a binary op starts reads a run-time
    value of its own shape."""
    full = [v for v in (x, y) if v.ref not in b.params and v.value.shape == out.shape]
    if full:
        return x, y
    grow = x if x.ref not in b.params else y
    wide = b.node("expand", [grow], {"shape": tuple(out.shape)}, grow.value.expand(out.shape),
                  ctx)
    return (wide, y) if grow is x else (x, wide)


def _one_value(b: Builder, v: Any, other: Any, out: torch.Tensor) -> Any:
    """A constant one-element tensor (Gemma's embedding normalizer, torch.tensor(8.0))
    as the scalar it holds, where the other operand has the result's shape already."""
    if isinstance(v, T) and v.ref in b.params and v.value.numel() == 1 and \
            isinstance(other, T) and other.ref not in b.params and other.value.shape == out.shape:
        return float(v.value)
    return v


def pow_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """x ** c for the constant exponents networks use: RMSNorm's square, roots, GELU-tanh's
    cube; any integer exponent up to 16 in magnitude by repeated multiplication (square
    and multiply), a negative one as the reciprocal of that."""
    x, e = a["input"], _scalar(a["exponent"])
    if not isinstance(x, T) or e is None:
        raise ctx.unsupported("a power other than a tensor to a constant exponent")
    if e == 1.0:
        return T(x.ref, out)
    ops_of = {2.0: "square", 0.5: "sqrt", -0.5: "rsqrt"}
    if e in ops_of:
        return b.node(ops_of[e], [x], {}, out, ctx)
    if e != int(e) or not 0 < abs(e) <= _MAX_POW:
        raise ctx.unsupported(f"a power with exponent {e:g} (integers up to {_MAX_POW} in "
                              "magnitude, 0.5 and -0.5 are lowered)")
    n = abs(int(e))
    power = x if n == 1 else _integer_power(b, x, n, ctx)
    if e < 0:
        return b.node("div", [power], {"scalar": 1.0, "reverse": True}, out, ctx)
    return T(power.ref, out)


_MAX_POW = 16


def _integer_power(b: Builder, x: T, n: int, ctx: Ctx) -> T:
    """x ** n, n >= 2, as squares of x multiplied together (n's binary digits)."""
    if n == 1:
        return x
    half = _integer_power(b, x, n // 2, ctx)
    power = b.node("square", [half], {}, half.value * half.value, ctx)
    if n % 2:
        power = b.node("mul", [power, x], {}, power.value * x.value, ctx)
    return power


def clamp_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """clamp / clamp_min / clamp_max / hardtanh by constants: a maximum then a minimum
    with scalars (relu6 stays one op)."""
    x = tensor_arg(a["input"], ctx)
    low, high = a.get("min", a.get("min_val")), a.get("max", a.get("max_val"))
    if any(v is not None and _scalar(v) is None for v in (low, high)):
        raise ctx.unsupported("clamp by tensors (constant bounds are lowered)")
    if low is not None and high is not None and (float(low), float(high)) == (0.0, 6.0):
        return b.node("relu6", [x], {}, out, ctx)
    if low is None and high is None:
        raise ctx.unsupported("clamp with neither bound")
    if low is not None:
        value = torch.clamp(x.value, min=float(low))
        x = b.node("maximum", [x], {"scalar": float(low), "reverse": False}, value, ctx)
    if high is not None:
        x = b.node("minimum", [x], {"scalar": float(high), "reverse": False}, out, ctx)
    return T(x.ref, out)


def max_pool_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    if a["return_indices"]:
        raise ctx.unsupported("max pooling that returns indices")
    k, x = pair(a["kernel_size"]), tensor_arg(a["input"], ctx)
    attrs = {"kernel": k, "stride": pair(a["stride"] or k), "padding": pair(a["padding"]),
             "dilation": pair(a["dilation"]), "ceil_mode": False}
    if a["ceil_mode"] and x.value.dim() == 4:
        x = _ceil_overhang(b, x, attrs, out, ctx)
    return b.node("max_pool2d", [x], attrs, out, ctx)


def _ceil_overhang(b: Builder, x: T, attrs: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """ceil_mode's last windows hang off the bottom and right edges: the input padded
    there with -inf (glue), so the pool itself is an ordinary one."""
    extra = []
    for i in (0, 1):
        size, pad = x.value.shape[2 + i], attrs["padding"][i]
        reach = (out.shape[2 + i] - 1) * attrs["stride"][i] \
            + attrs["dilation"][i] * (attrs["kernel"][i] - 1) + 1
        extra.append(max(0, reach - (size + 2 * pad)))
    if not any(extra):
        return x
    grown = F.pad(x.value, (0, extra[1], 0, extra[0]), value=float("-inf"))
    return b.node("pad", [x], {"pad": (0, extra[1], 0, extra[0]), "mode": "constant",
                               "value": float("-inf")}, grown, ctx)


def avg_pool_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    if a["divisor_override"] is not None:
        raise ctx.unsupported("avg pooling with divisor_override")
    k = pair(a["kernel_size"])
    attrs = {"kernel": k, "stride": pair(a["stride"] or k), "padding": pair(a["padding"]),
             "ceil_mode": bool(a["ceil_mode"]),
             "count_include_pad": bool(a["count_include_pad"])}
    return b.node("avg_pool2d", [tensor_arg(a["input"], ctx)], attrs, out, ctx)


def adaptive_avg_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x = tensor_arg(a["input"], ctx)
    (h, w), (oh, ow) = x.value.shape[-2:], out.shape[-2:]
    if h % oh == 0 and w % ow == 0:  # an ordinary average pool: one compute definition
        k = (h // oh, w // ow)
        attrs = {"kernel": k, "stride": k, "padding": (0, 0), "ceil_mode": False,
                 "count_include_pad": True}
        return b.node("avg_pool2d", [x], attrs, out, ctx)
    return b.node("adaptive_avg_pool2d", [x], {"output_size": (oh, ow)}, out, ctx)


def reshape_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x = tensor_arg(a["input"], ctx)
    if tuple(out.shape) == tuple(x.value.shape):
        return T(x.ref, out)
    return b.node("reshape", [x], {"shape": tuple(out.shape)}, out, ctx)


def alias_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    if a.get("training"):
        raise ctx.unsupported("dropout in training mode (call model.eval())")
    x = tensor_arg(a["input"], ctx)
    if out.dtype != x.value.dtype or tuple(out.shape) != tuple(x.value.shape):
        raise ctx.unsupported("a copy that changes dtype or shape")
    return T(x.ref, out)


def _permute(b: Builder, x: T, dims: tuple, out: torch.Tensor, ctx: Ctx) -> T:
    dims = tuple(norm_dim(int(d), x.value.dim()) for d in dims)
    if dims == tuple(range(len(dims))):
        return T(x.ref, out)
    return b.node("permute", [x], {"dims": dims}, out, ctx)


def permute_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    dims = a["dims"][0] if len(a["dims"]) == 1 and isinstance(a["dims"][0], (list, tuple)) \
        else a["dims"]
    return _permute(b, tensor_arg(a["input"], ctx), tuple(dims), out, ctx)


def transpose_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x = tensor_arg(a["input"], ctx)
    dims = list(range(x.value.dim()))
    i, j = norm_dim(a["dim0"], len(dims)), norm_dim(a["dim1"], len(dims))
    dims[i], dims[j] = dims[j], dims[i]
    return _permute(b, x, tuple(dims), out, ctx)


def t_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x = tensor_arg(a["input"], ctx)
    return _permute(b, x, tuple(reversed(range(x.value.dim()))), out, ctx)


def cat_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    xs = [tensor_arg(t, ctx) for t in a["tensors"]]
    return b.node("concat", xs, {"dim": norm_dim(int(a["dim"]), out.dim())}, out, ctx)


def stochastic_depth_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """torchvision's stochastic depth: the identity in eval mode."""
    if a["training"] and a["p"] > 0:
        raise ctx.unsupported("stochastic depth in training mode (call model.eval())")
    return T(tensor_arg(a["input"], ctx).ref, out)


def mean_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """A mean over the two spatial dims of an NCHW value (global pooling written as a
    mean, as in squeeze-excite blocks) is an average pool over the whole map; a mean over
    any other dims is a row reduction (reduce_handler)."""
    x = tensor_arg(a["input"], ctx)
    if x.value.dim() != 4 or a["dtype"] is not None or _reduced_dims(a["dim"], 4) != [2, 3]:
        return reduce_handler("mean")(b, a, out, ctx)
    h, w = x.value.shape[2:]
    attrs = {"kernel": (h, w), "stride": (h, w), "padding": (0, 0), "ceil_mode": False,
             "count_include_pad": True}
    pooled = out.reshape(out.shape[0], out.shape[1], 1, 1)
    y = b.node("avg_pool2d", [x], attrs, pooled, ctx)
    return y if a["keepdim"] else b.node("reshape", [y], {"shape": tuple(out.shape)}, out,
                                         ctx)


def _reduced_dims(dim, ndim: int) -> list[int]:
    """The sorted dims a reduction's `dim` argument names (None or () for all of them)."""
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return list(range(ndim))
    dims = dim if isinstance(dim, (list, tuple)) else (dim,)
    return sorted({norm_dim(int(d), ndim) for d in dims})


def reduce_handler(kind: str) -> Callable:
    """sum / mean / amax / amin over any dims: a "reduce" row task over the last axis.
    The reduced dims are moved last (a permute, when they are not last already) and
    flattened into one, so the task reads rows; its output keeps an axis of 1, which a
    reshape drops unless keepdim and the reduced dim was the last (RMSNorm's mean of
    squares, whose epilogue then fuses into the reduction)."""
    def handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
        x = tensor_arg(a["input"], ctx)
        if a.get("dtype") is not None or not x.value.is_floating_point():
            raise ctx.unsupported(f"a {kind} of integers or that changes the dtype")
        return reduce_dims(b, x, kind, _reduced_dims(a.get("dim"), x.value.dim()), out, ctx)
    return handler


def reduce_dims(b: Builder, x: T, kind: str, dims: list[int], out: torch.Tensor,
                ctx: Ctx) -> T:
    """x reduced by `kind` over `dims` (sorted, non-negative), giving `out`."""
    value, ndim = x.value, x.value.dim()
    if ndim == 0 or value.numel() == 0:
        raise ctx.unsupported(f"a {kind} of an empty or 0-d tensor")
    kept = [d for d in range(ndim) if d not in dims]
    if kept + dims != list(range(ndim)):
        perm = kept + dims
        value = value.permute(perm)
        x = b.node("permute", [x], {"dims": tuple(perm)}, value, ctx)
    rows = tuple(value.shape[:len(kept)])
    width = math.prod(value.shape[len(kept):])
    if value.shape[len(kept):] != (width,):
        value = value.reshape(*rows, width)
        x = b.node("reshape", [x], {"shape": tuple(value.shape)}, value, ctx)
    result = REDUCE_FNS[kind](value)
    y = b.node("reduce", [x], {"kind": kind}, result, ctx)
    if tuple(out.shape) == tuple(result.shape):
        return T(y.ref, out)
    return b.node("reshape", [y], {"shape": tuple(out.shape)}, out, ctx)


def vector_norm_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """The 2-norm (sqrt of the sum of squares), 1-norm (sum of abs) and inf-norm (max of
    abs) over dims (torch.linalg.vector_norm, Tensor.norm; F.normalize's): elementwise
    ops around a reduce task."""
    x = tensor_arg(a["input"], ctx)
    order = a.get("ord", a.get("p", 2))
    order = 2.0 if order == "fro" else _scalar(order)
    if a.get("dtype") is not None or order not in (1.0, 2.0, math.inf):
        raise ctx.unsupported(f"a norm of order {order} (1, 2 and inf are lowered)")
    dims = _reduced_dims(a.get("dim"), x.value.dim())
    src = x.value.square() if order == 2.0 else x.value.abs()
    x = b.node("square" if order == 2.0 else "abs", [x], {}, src, ctx)
    kind = "max" if order == math.inf else "sum"
    if order != 2.0:
        return reduce_dims(b, x, kind, dims, out, ctx)
    total = src.sum(dims, keepdim=True) if a.get("keepdim") else src.sum(dims)
    y = reduce_dims(b, x, kind, dims, total, ctx)
    return b.node("sqrt", [y], {}, out, ctx)


def group_norm_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """group_norm: each sample's channel groups normalized by their own mean and variance,
    then the per-channel weight and bias."""
    x = tensor_arg(a["input"], ctx)
    return normalize_groups(b, x, int(a["num_groups"]), a.get("weight"), a.get("bias"),
                            float(a["eps"]), out, ctx)


def instance_norm_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """instance_norm: group norm with one channel per group; with running statistics
    instead of the input's (track_running_stats in eval), a per-channel affine."""
    x = tensor_arg(a["input"], ctx)
    if not a.get("use_input_stats", True):
        mean, var = a.get("running_mean"), a.get("running_var")
        weight, bias = (v.value if isinstance(v, T) else v
                        for v in (a.get("weight"), a.get("bias")))
        if not all(isinstance(v, (torch.Tensor, T)) for v in (mean, var)):
            raise ctx.unsupported("instance norm without running statistics to use")
        mean, var = (v.value if isinstance(v, T) else v for v in (mean, var))
        return _affine(b, x, mean, var, weight, bias, float(a["eps"]), out, ctx)
    return normalize_groups(b, x, x.value.shape[1], a.get("weight"), a.get("bias"),
                            float(a["eps"]), out, ctx)


def normalize_groups(b: Builder, x: T, groups: int, weight, bias, eps: float,
                     out: torch.Tensor, ctx: Ctx) -> T:
    """(x - mean) * rsqrt(var + eps) over each (sample, group) of channels and positions,
    as rows: a mean reduction, a subtraction, a mean of squares with `+ eps` and rsqrt
    fused into it, a multiplication; then weight and bias as a per-channel affine."""
    v = x.value
    if v.dim() < 3 or v.shape[1] % groups:
        raise ctx.unsupported(f"a group norm of {groups} groups over a value of shape "
                              f"{tuple(v.shape)}")
    rows = v.reshape(v.shape[0], groups, -1)
    xr = b.node("reshape", [x], {"shape": tuple(rows.shape)}, rows, ctx)
    mean = rows.mean(-1, keepdim=True)
    centred = rows - mean
    var = centred.square().mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    m = b.node("reduce", [xr], {"kind": "mean"}, mean, ctx)
    cen = b.node("sub", [xr, m], {}, centred, ctx)
    sq = b.node("square", [cen], {}, centred.square(), ctx)
    r = b.node("reduce", [sq], {"kind": "mean"}, var, ctx)
    r = b.node("add", [r], {"scalar": eps, "reverse": False}, var + eps, ctx)
    r = b.node("rsqrt", [r], {}, rstd, ctx)
    y = b.node("mul", [cen, r], {}, centred * rstd, ctx)
    normed = (centred * rstd).reshape(v.shape)
    y = b.node("reshape", [y], {"shape": tuple(v.shape)}, normed, ctx)
    if weight is None and bias is None:
        return T(y.ref, out)
    c = v.shape[1]
    w = need_param(b, weight, ctx, "weight") if weight is not None else \
        b.param(f"{ctx.layer}.norm_weight", torch.ones(c))
    t = need_param(b, bias, ctx, "bias") if bias is not None else \
        b.param(f"{ctx.layer}.norm_bias", torch.zeros(c))
    return b.node("affine", [y, w, t], {"axis": 1}, out, ctx)


def interpolate_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """Resizing an NCHW image (interpolate, nn.Upsample): nearest by whole factors as an
    expand (glue, no arithmetic); every other linear, separable mode (bilinear, bicubic,
    area, nearest by other factors) as two denses by constant resampling matrices, along
    W then along H. The matrices are PyTorch's own: the same call applied to the one-hot
    rows of each axis; the result is checked against the call's output at capture."""
    x = tensor_arg(a["input"], ctx)
    v = x.value
    if v.dim() != 4 or a.get("antialias"):
        raise ctx.unsupported("resizing other than of an NCHW value without antialias")
    (n, c, h, w), (ho, wo) = v.shape, out.shape[2:]
    grid = v.reshape(n, c, h, 1, w, 1)
    wide = grid.expand(n, c, h, ho // h, w, wo // w)
    # a scale factor that is not the size ratio maps pixels otherwise: check, as below
    if a.get("mode", "nearest") == "nearest" and ho % h == 0 and wo % w == 0 and \
            torch.equal(wide.reshape(out.shape), out):
        y = b.node("reshape", [x], {"shape": tuple(grid.shape)}, grid, ctx)
        y = b.node("expand", [y], {"shape": tuple(wide.shape)}, wide, ctx)
        return b.node("reshape", [y], {"shape": tuple(out.shape)}, out, ctx)
    along_h, along_w = (_resampling(a, v, axis) for axis in (2, 3))
    got = torch.einsum("ph,nchw,qw->ncpq", along_h, v, along_w)
    if got.shape != out.shape or not torch.allclose(got, out, atol=1e-5, rtol=1e-4):
        raise ctx.unsupported(f"resizing in mode {a.get('mode')!r} that is not separable")
    y = x
    if not (wo == w and torch.equal(along_w, torch.eye(w))):
        wide = v @ along_w.T
        y = b.node("dense", [y, b.param(f"{ctx.layer}.resample_w", along_w)], {}, wide, ctx)
        v = wide
    if ho == h and torch.equal(along_h, torch.eye(h)):
        return T(y.ref, out)
    turned = v.transpose(2, 3)
    y = b.node("permute", [y], {"dims": (0, 1, 3, 2)}, turned, ctx)
    tall = turned @ along_h.T
    y = b.node("dense", [y, b.param(f"{ctx.layer}.resample_h", along_h)], {}, tall, ctx)
    return b.node("permute", [y], {"dims": (0, 1, 3, 2)}, out, ctx)


def upsample_aten_handler(mode: str) -> Callable:
    """aten's upsample ops (what torch.export leaves of interpolate): resized to the
    output's size, with align_corners where the mode has it (a scale-based mapping that
    differs from the size-based one fails the check in interpolate_handler: an island)."""
    def handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
        rest = a.get("args", ())
        align = rest[1] if mode in ("bilinear", "bicubic") and len(rest) > 1 else None
        call = {"input": a["input"], "size": tuple(out.shape[2:]), "mode": mode,
                "align_corners": align}
        return interpolate_handler(b, call, out, ctx)
    return handler


def _resampling(a: dict, v: torch.Tensor, axis: int) -> torch.Tensor:
    """The (out, in) matrix of the resize along `axis` (2: H, 3: W): the call applied to
    one-hot images that are 1 wide along the other axis (which it then keeps at 1)."""
    n_in = v.shape[axis]
    basis = torch.eye(n_in).reshape(n_in, 1, n_in, 1)  # image i: one-hot at row i
    if axis == 3:
        basis = basis.transpose(2, 3)
    size, scale = a.get("size"), a.get("scale_factor")
    size = None if size is None else tuple(size) if isinstance(size, (list, tuple)) \
        else (size, size)
    scale = None if scale is None else tuple(scale) if isinstance(scale, (list, tuple)) \
        else (scale, scale)
    keep = 3 - (axis - 2)  # the other axis, kept at 1
    if size is not None:
        size = tuple(1 if d + 2 == keep else s for d, s in enumerate(size))
    if scale is not None:
        scale = tuple(1.0 if d + 2 == keep else float(s) for d, s in enumerate(scale))
    options = {k: a[k] for k in ("mode", "align_corners", "recompute_scale_factor")
               if a.get(k) is not None}
    with torch.no_grad():
        moved = F.interpolate(basis, size=size, scale_factor=scale, **options)
    return moved.reshape(n_in, -1).T.contiguous()  # (out, in)


def where_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """where(mask, x, fill) / where(mask, fill, x) / x.masked_fill(mask, fill) with a
    constant boolean mask and a constant scalar fill: an infinite fill (an attention mask)
    is the addition of a constant tensor (0 where x is kept, the fill elsewhere), exact;
    a finite one multiplies by the kept mask, then adds the fill where x is not kept."""
    cond, x, y = a["condition"], a["input"], a["other"]
    if isinstance(cond, T) or not isinstance(cond, torch.Tensor) or cond.dtype != torch.bool:
        raise ctx.unsupported("where with a condition computed at run time (a constant "
                              "boolean mask is lowered)")
    if isinstance(x, T) == isinstance(y, T):
        raise ctx.unsupported("where choosing between two run-time tensors or none")
    value, fill, keep = (x, y, cond) if isinstance(x, T) else (y, x, ~cond)
    s = _scalar(fill)
    if s is None:
        raise ctx.unsupported("where with a fill that is not a constant scalar")
    keep = keep.expand(out.shape)
    shift = torch.where(keep, 0.0, s).float().contiguous()
    if math.isinf(s):
        add = b.param(f"{ctx.layer}.where_fill", shift)
        return b.node("add", [value, add], {}, out, ctx)
    kept = b.param(f"{ctx.layer}.where_keep", keep.float().contiguous())
    masked = value.value * keep
    y = b.node("mul", [value, kept], {}, masked, ctx)
    add = b.param(f"{ctx.layer}.where_fill", shift)
    return b.node("add", [y, add], {}, out, ctx)


def masked_fill_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    return where_handler(b, {"condition": a["mask"], "input": a["value"], "other": a["input"]},
                         out, ctx)


def addmm_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """beta * input + alpha * (x @ w): addmm (GPT-2's Conv1D), baddbmm (WavLM's attention
    with its position bias): a matmul (a dense where w is a weight: _product) with the
    scale and the addition in its epilogue (beta 0 leaves the input out, as PyTorch
    ignores it then)."""
    bias, x = tensor_arg(a["input"], ctx, "bias"), tensor_arg(a["mat1"], ctx)
    w = tensor_arg(a["mat2"], ctx, "mat2")
    alpha, beta = float(a["alpha"]), float(a["beta"])
    product = x.value @ w.value
    y = _product(b, x, w, product, ctx)
    if alpha != 1.0:
        product = product * alpha
        y = b.node("mul", [y], {"scalar": alpha, "reverse": False}, product, ctx)
    if beta == 0.0:
        return T(y.ref, out)
    if beta != 1.0 and bias.ref in b.params:
        bias = b.param(b.unique(f"{ctx.layer}.input_scaled"), bias.value * beta)
    elif beta != 1.0:
        bias = b.node("mul", [bias], {"scalar": beta, "reverse": False}, bias.value * beta, ctx)
    return b.node("add", [y, bias], {}, out, ctx)


def addcmul_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """input + value * t1 * t2 (ConvNeXt-V2's global response norm): two multiplications
    and an addition, fused like any elementwise chain."""
    t1, t2, value = a["tensor1"], a["tensor2"], a["value"]
    concrete = lambda v: v.value if isinstance(v, T) else v  # noqa: E731
    product = concrete(t1) * concrete(t2)
    y = binary("mul")(b, {"input": t1, "other": t2}, product, ctx)
    if value != 1:
        product = product * value
        y = binary("mul")(b, {"input": y, "other": value}, product, ctx)
    return binary("add")(b, {"input": a["input"], "other": y}, out, ctx)


def embedding_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """A table lookup by integer ids: glue (a gather PyTorch runs between our kernels)."""
    ids = tensor_arg(a.get("input", a.get("indices")), ctx, "indices")
    if a.get("max_norm") is not None:
        raise ctx.unsupported("an embedding with max_norm (it rewrites its weights)")
    weight = need_param(b, a["weight"], ctx, "weight")
    return b.node("embedding", [ids, weight], {}, out, ctx)


def softmax_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    if a["dim"] is None or a.get("dtype") is not None or a.get("half_to_float"):
        raise ctx.unsupported("softmax needs an explicit dim and no dtype change")
    x = tensor_arg(a["input"], ctx)
    return b.node("softmax", [x], {"dim": norm_dim(int(a["dim"]), out.dim())}, out, ctx)


def layer_norm_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x, shape = tensor_arg(a["input"], ctx), tuple(int(s) for s in a["normalized_shape"])
    w = need_param(b, a["weight"], ctx, "weight") if a["weight"] is not None \
        else b.param(f"{ctx.layer}.ln_weight", torch.ones(shape))
    bias = need_param(b, a["bias"], ctx, "bias") if a["bias"] is not None \
        else b.param(f"{ctx.layer}.ln_bias", torch.zeros(shape))
    attrs = {"normalized_shape": shape, "eps": float(a["eps"])}
    return b.node("layer_norm", [x, w, bias], attrs, out, ctx)


# the Python operators of the comparisons (x != c in a traced forward)
_OPERATORS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
              "gt": operator.gt, "ge": operator.ge}

_TORCH_FUNCS: list[tuple[tuple, Callable, Callable]] = [
    ((F.conv2d, torch.conv2d, "aten::conv2d"), _conv2d_stub, conv2d_handler),
    ((F.conv1d, torch.conv1d, "aten::conv1d"), _conv2d_stub, conv1d_handler),
    ((F.linear, "aten::linear"), _linear_stub, dense_handler),
    ((torch.matmul, operator.matmul, torch.bmm, "matmul", "bmm", "aten::matmul", "aten::bmm"),
     _matmul_stub, matmul_handler),
    ((F.batch_norm,), _batch_norm_stub, batch_norm_handler),
    (("aten::batch_norm",), _batch_norm_aten_stub, batch_norm_handler),
    ((torch.relu, F.relu, "relu", "relu_", "aten::relu", "aten::relu_"), _unary_stub,
     unary("relu")),
    ((F.relu6,), _unary_stub, unary("relu6")),
    ((F.hardtanh, "aten::hardtanh", "aten::hardtanh_"), _hardtanh_stub, hardtanh_handler),
    ((F.gelu, "aten::gelu"), _gelu_stub, gelu_handler),
    ((torch.sigmoid, F.sigmoid, "sigmoid", "aten::sigmoid"), _unary_stub, unary("sigmoid")),
    ((F.silu, "aten::silu", "aten::silu_"), _unary_stub, unary("silu")),
    ((torch.tanh, F.tanh, "tanh", "aten::tanh"), _unary_stub, unary("tanh")),
    ((F.hardswish, "aten::hardswish", "aten::hardswish_"), _unary_stub, unary("hardswish")),
    ((F.hardsigmoid, "aten::hardsigmoid", "aten::hardsigmoid_"), _unary_stub,
     unary("hardsigmoid")),
    ((F.mish, "aten::mish", "aten::mish_"), _unary_stub, unary("mish")),
    ((torch.exp, "exp", "aten::exp"), _unary_stub, unary("exp")),
    ((torch.erf, torch.special.erf, "erf", "aten::erf", "aten::special_erf"), _unary_stub,
     unary("erf")),
    ((torch.sqrt, "sqrt", "aten::sqrt"), _unary_stub, unary("sqrt")),
    ((torch.rsqrt, "rsqrt", "aten::rsqrt"), _unary_stub, unary("rsqrt")),
    ((torch.square, "square", "aten::square"), _unary_stub, unary("square")),
    ((torch.neg, operator.neg, "neg", "aten::neg"), _unary_stub, unary("neg")),
    ((torch.abs, operator.abs, "abs", "aten::abs"), _unary_stub, unary("abs")),
    ((torch.pow, operator.pow, "pow", "aten::pow"), _pow_stub, pow_handler),
    ((torch.clamp, torch.clip, "clamp", "clip", "clamp_", "aten::clamp", "aten::clip",
      "aten::clamp_"), _clamp_stub, clamp_handler),
    ((torch.clamp_min, "clamp_min", "aten::clamp_min"), _clamp_min_stub, clamp_handler),
    ((torch.clamp_max, "clamp_max", "aten::clamp_max"), _clamp_max_stub, clamp_handler),
    ((torch.maximum, "maximum", "aten::maximum"), _binary_stub, binary("maximum")),
    ((torch.minimum, "minimum", "aten::minimum"), _binary_stub, binary("minimum")),
    ((operator.add, operator.iadd, torch.add, "add", "add_", "aten::add", "aten::add_"),
     _add_sub_stub, binary("add")),
    ((operator.sub, operator.isub, torch.sub, "sub", "sub_", "aten::sub", "aten::sub_"),
     _add_sub_stub, binary("sub")),
    ((operator.mul, operator.imul, torch.mul, "mul", "mul_", "aten::mul", "aten::mul_"),
     _mul_stub, binary("mul")),
    ((operator.truediv, operator.itruediv, torch.div, "div", "div_", "aten::div", "aten::div_"),
     _div_stub, binary("div")),
    ((F.max_pool2d, torch.max_pool2d, "aten::max_pool2d"), _max_pool_stub, max_pool_handler),
    ((F.avg_pool2d, "aten::avg_pool2d"), _avg_pool_stub, avg_pool_handler),
    ((F.adaptive_avg_pool2d, "aten::adaptive_avg_pool2d"), _adaptive_avg_pool_stub,
     adaptive_avg_handler),
    ((torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze, "flatten", "view",
      "reshape", "squeeze", "unsqueeze", "unflatten", "view_as", "reshape_as",
      "aten::flatten", "aten::view", "aten::reshape", "aten::_unsafe_view", "aten::squeeze",
      "aten::unsqueeze", "aten::unflatten"), _any_stub, reshape_handler),
    ((torch.permute, "permute", "aten::permute"), _permute_stub, permute_handler),
    ((torch.transpose, "transpose", "aten::transpose"), _transpose_stub, transpose_handler),
    ((torch.t, "t", "aten::t"), _any_stub, t_handler),
    ((torch.cat, torch.concat, "aten::cat"), _cat_stub, cat_handler),
    ((torch.stack, "aten::stack"), _cat_stub, stack_handler),
    ((F.softmax, torch.softmax, "softmax", "aten::softmax"), _softmax_stub, softmax_handler),
    (("aten::_softmax",), _softmax_aten_stub, softmax_handler),
    ((F.layer_norm, "aten::layer_norm"), _layer_norm_stub, layer_norm_handler),
    ((F.dropout, "aten::dropout"), _dropout_stub, alias_handler),
    (("torchvision.ops.stochastic_depth.stochastic_depth",), _stochastic_depth_stub,
     stochastic_depth_handler),
    ((torch.mean, "mean", "aten::mean"), _mean_stub, mean_handler),
    ((torch.sum, "sum", "aten::sum"), _mean_stub, reduce_handler("sum")),
    ((torch.amax, "amax", "aten::amax"), _amax_stub, reduce_handler("max")),
    ((torch.amin, "amin", "aten::amin"), _amax_stub, reduce_handler("min")),
    ((torch.linalg.vector_norm, "aten::linalg_vector_norm"), _vector_norm_stub,
     vector_norm_handler),
    ((F.group_norm,), _group_norm_stub, group_norm_handler),
    ((torch.where, "where", "aten::where"), _where_stub, where_handler),
    ((torch.masked_fill, "masked_fill", "aten::masked_fill"), _masked_fill_stub,
     masked_fill_handler),
    (("aten::group_norm",), _group_norm_aten_stub, group_norm_handler),
    ((F.instance_norm,), _instance_norm_stub, instance_norm_handler),
    ((F.interpolate, F.upsample), _interpolate_stub, interpolate_handler),
    (("aten::upsample_nearest2d",), _any_stub, upsample_aten_handler("nearest")),
    (("aten::_upsample_nearest_exact2d",), _any_stub, upsample_aten_handler("nearest-exact")),
    (("aten::upsample_bilinear2d",), _any_stub, upsample_aten_handler("bilinear")),
    (("aten::upsample_bicubic2d",), _any_stub, upsample_aten_handler("bicubic")),
    ((torch.norm, "norm", "aten::norm"), _norm_stub, vector_norm_handler),
    ((operator.getitem,), _getitem_stub, getitem_handler),
    (("aten::index",), _index_stub, index_handler),
    ((torch.select, "select", "aten::select"), _select_stub, select_handler),
    ((torch.addmm, torch.baddbmm, "aten::addmm", "aten::baddbmm"), _addmm_stub,
     addmm_handler),
    ((torch.addcmul, "addcmul", "aten::addcmul"), _addcmul_stub, addcmul_handler),
    ((F.scaled_dot_product_attention, "aten::scaled_dot_product_attention"), _sdpa_stub,
     sdpa_handler),
    ((F.embedding,), _embedding_stub, embedding_handler),
    (("aten::embedding",), _embedding_aten_stub, embedding_handler),
    (("aten::slice",), _slice_stub, slice_handler),
    ((F.pad, "aten::pad"), _pad_stub, pad_handler),
    ((torch.constant_pad_nd, "aten::constant_pad_nd"), _constant_pad_stub, pad_handler),
    ((torch.roll, "roll", "aten::roll"), _roll_stub, roll_handler),
    (("unfold", "aten::unfold"), _unfold_stub, unfold_handler),
    ((torch.broadcast_to, "expand", "expand_as", "broadcast_to", "repeat", "aten::expand",
      "aten::expand_as", "aten::broadcast_to", "aten::repeat"), _any_stub, expand_handler),
    ((torch.einsum, "aten::einsum"), _einsum_stub, einsum_handler),
    ((torch.swapaxes, torch.swapdims, "swapaxes", "swapdims", "aten::swapaxes",
      "aten::swapdims"), _transpose_stub, transpose_handler),
    (("contiguous", "clone", "detach", "aten::contiguous", "aten::clone", "aten::alias",
      "aten::detach", torch.clone), _any_stub, alias_handler),
    (("to", "type_as", "float", "int", "long", "type", "aten::to", "aten::_to_copy",
      "aten::type_as"), _any_stub, cast_handler),
    ((torch.cumsum, "cumsum", "aten::cumsum"), _cumsum_stub, cumsum_handler),
    ((torch.gather, "gather", "aten::gather"), _gather_stub, gather_handler),
    ((torch.argmax, "argmax", "aten::argmax"), _argmax_stub, argmax_handler),
] + [((COMPARE_FNS[k], k, f"aten::{k}", _OPERATORS[k]), _binary_stub, compare_handler(k))
     for k in COMPARE_FNS] + ACTIVATIONS

TABLE: dict[Any, tuple[Callable, Callable]] = {
    key: (stub, handler) for keys, stub, handler in _TORCH_FUNCS for key in keys
}

# Ops whose output shape depends on tensor values: refused as dynamic shapes.
DATA_DEPENDENT = frozenset({
    torch.nonzero, torch.masked_select, torch.unique, torch.argwhere, "nonzero",
    "masked_select", "unique", "item", "tolist", "aten::nonzero", "aten::masked_select",
    "aten::unique", "aten::_unique2", "aten::item", "aten::_local_scalar_dense",
})


# Ops whose result depends on their tensor arguments' shapes alone: constants.
SHAPE_ONLY = frozenset({
    torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like, "new_zeros",
    "new_ones", "new_full", "new_empty", "aten::new_zeros", "aten::new_ones", "aten::new_full",
    "aten::new_empty", "aten::zeros_like", "aten::ones_like", "aten::full_like",
    "aten::empty_like",
})


def shape_only(target: Any) -> bool:
    try:
        return _key(target) in SHAPE_ONLY
    except TypeError:
        return False


# ops that return several tensors and have a handler: (names, stub, handler)
_SPLITS: list[tuple[tuple, Callable, Callable]] = [
    ((torch.chunk, torch.split, "chunk", "split", "split_with_sizes", "aten::chunk",
      "aten::split", "aten::split_with_sizes"), _split_stub, split_handler),
    ((torch.unbind, "unbind", "aten::unbind"), _unbind_stub, unbind_handler),
]
SPLIT_STUBS = {handler: stub for _, stub, handler in _SPLITS}
_SPLIT_TABLE = {key: handler for keys, _, handler in _SPLITS for key in keys}


def _key(target: Any) -> Any:
    """How the tables name a call target: aten ops by schema name, functions outside
    torch (torchvision's) by qualified name, the rest as themselves."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name
    module = getattr(target, "__module__", None) or ""
    inside_torch = module.split(".")[0] in ("torch", "_operator", "builtins")
    if callable(target) and module and not inside_torch and hasattr(target, "__qualname__"):
        return f"{module}.{target.__qualname__}"
    return target


def lookup(target: Any) -> tuple[Callable, Callable] | None:
    try:
        return TABLE.get(_key(target))
    except TypeError:  # unhashable target
        return None


def lookup_split(target: Any) -> Callable | None:
    try:
        return _SPLIT_TABLE.get(_key(target))
    except TypeError:
        return None


def check_static(target: Any, ctx: Ctx) -> None:
    schema = getattr(target, "_schema", None)
    key = schema.name if schema is not None else target
    try:
        dynamic = key in DATA_DEPENDENT
    except TypeError:
        dynamic = False
    if dynamic:
        raise DynamicShapeError(f"'{ctx.what}' has an output shape that depends on values",
                                ctx.layer)
