"""Activations with a parameter, and those written in terms of others, as nodes of the
one op vocabulary (task.UNARY_OPS / BINARY_OPS), so they fuse into the kernel before them:

- LeakyReLU, PReLU and eval-mode RReLU are `prelu` (x if x >= 0 else a*x), the slope a
  a scalar or PReLU's per-channel weights (a tensor operand along dim 1);
- ELU is `elu` (x if x > 0 else a*(e^x - 1)); SELU and CELU are ELU scaled;
- softplus is `softplus` (beta 1), between a multiplication and a division by beta
  otherwise; LogSigmoid is -softplus(-x); Softsign and Tanhshrink are what they stand for.

Each handler gets (builder, bound args, concrete output, ctx); `MODULES` maps the nn
modules to handlers of (builder, module, input, output, ctx), for the capture's table.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from raytune_kernels.frontend.builder import Builder, Ctx, T, need_param, tensor_arg

# torch's SELU constants (torch/nn/modules/activation.py)
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
# softplus is x itself past its threshold in PyTorch; past this one the exact log(1 + e^x)
# rounds to x in float32 as well, so the two agree
SOFTPLUS_EXACT_FROM = 15.0


def _scalar_op(b: Builder, op: str, x: T, c: float, value: torch.Tensor, ctx: Ctx) -> T:
    return b.node(op, [x], {"scalar": float(c), "reverse": False}, value, ctx)


def leaky_relu_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x = tensor_arg(a["input"], ctx)
    return _scalar_op(b, "prelu", x, a["negative_slope"], out, ctx)


def rrelu_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """RReLU in eval mode: a leaky ReLU with the mean of its slope range."""
    if a["training"]:
        raise ctx.unsupported("RReLU in training mode (call model.eval())")
    x = tensor_arg(a["input"], ctx)
    return _scalar_op(b, "prelu", x, (a["lower"] + a["upper"]) / 2, out, ctx)


def prelu_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """PReLU: one slope (a scalar) or one per channel (dim 1), read along that dim."""
    x, w = tensor_arg(a["input"], ctx), need_param(b, a["weight"], ctx, "weight")
    if w.value.numel() == 1:
        return _scalar_op(b, "prelu", x, float(w.value), out, ctx)
    if x.value.dim() < 2 or w.value.numel() != x.value.shape[1]:
        raise ctx.unsupported(f"PReLU weights of shape {tuple(w.value.shape)} on an input "
                              f"of shape {tuple(x.value.shape)}")
    along = w.value.reshape(-1, *([1] * (x.value.dim() - 2)))
    slopes = b.param(b.unique(f"{ctx.layer}.slopes"), along)
    return b.node("prelu", [x, slopes], {}, out, ctx)


def elu(b: Builder, x: T, alpha: float, scale: float, out: torch.Tensor, ctx: Ctx) -> T:
    """scale * elu(x, alpha): one node, or two with the scale."""
    if scale == 1.0:
        return _scalar_op(b, "elu", x, alpha, out, ctx)
    y = _scalar_op(b, "elu", x, alpha, F.elu(x.value, alpha), ctx)
    return _scalar_op(b, "mul", y, scale, out, ctx)


def elu_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """F.elu, and aten.elu's scale (input_scale other than 1 scales one side only)."""
    if float(a.get("input_scale", 1.0)) != 1.0:
        raise ctx.unsupported("elu with an input_scale")
    x = tensor_arg(a["input"], ctx)
    return elu(b, x, float(a["alpha"]), float(a.get("scale", 1.0)), out, ctx)


def selu_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    return elu(b, tensor_arg(a["input"], ctx), SELU_ALPHA, SELU_SCALE, out, ctx)


def celu_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """celu(x, a) = a * elu(x / a, 1)."""
    x, alpha = tensor_arg(a["input"], ctx), float(a["alpha"])
    if alpha == 1.0:
        return elu(b, x, 1.0, 1.0, out, ctx)
    y = _scalar_op(b, "div", x, alpha, x.value / alpha, ctx)
    return elu(b, y, 1.0, alpha, out, ctx)


def softplus(b: Builder, x: T, beta: float, threshold: float, out: torch.Tensor,
             ctx: Ctx) -> T:
    """softplus(x * beta) / beta; PyTorch's threshold must be where the two agree."""
    if threshold < SOFTPLUS_EXACT_FROM:
        raise ctx.unsupported(f"softplus with threshold {threshold} (from "
                              f"{SOFTPLUS_EXACT_FROM:g} it is lowered)")
    if beta == 1.0:
        return b.node("softplus", [x], {}, out, ctx)
    y = _scalar_op(b, "mul", x, beta, x.value * beta, ctx)
    y = b.node("softplus", [y], {}, F.softplus(y.value), ctx)
    return _scalar_op(b, "div", y, beta, out, ctx)


def softplus_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    x = tensor_arg(a["input"], ctx)
    return softplus(b, x, float(a["beta"]), float(a["threshold"]), out, ctx)


def logsigmoid_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """log(sigmoid(x)) = -softplus(-x)."""
    x = tensor_arg(a["input"], ctx)
    y = b.node("neg", [x], {}, -x.value, ctx)
    y = b.node("softplus", [y], {}, F.softplus(y.value), ctx)
    return b.node("neg", [y], {}, out, ctx)


def softsign_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """x / (1 + |x|)."""
    x = tensor_arg(a["input"], ctx)
    y = b.node("abs", [x], {}, x.value.abs(), ctx)
    y = _scalar_op(b, "add", y, 1.0, y.value + 1.0, ctx)
    return b.node("div", [x, y], {}, out, ctx)


def tanhshrink_handler(b: Builder, a: dict, out: torch.Tensor, ctx: Ctx) -> T:
    """x - tanh(x)."""
    x = tensor_arg(a["input"], ctx)
    y = b.node("tanh", [x], {}, torch.tanh(x.value), ctx)
    return b.node("sub", [x, y], {}, out, ctx)


def _input_stub(input, inplace=False): ...
def _leaky_relu_stub(input, negative_slope=0.01, inplace=False): ...
def _rrelu_stub(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False): ...
def _prelu_stub(input, weight): ...
def _elu_stub(input, alpha=1.0, inplace=False): ...
def _elu_aten_stub(input, alpha=1.0, scale=1.0, input_scale=1.0): ...
def _celu_stub(input, alpha=1.0, inplace=False): ...
def _softplus_stub(input, beta=1.0, threshold=20.0): ...


# (names, signature stub, handler), as frontend/ops.py's table takes them
FUNCTIONS = [
    ((F.leaky_relu, "aten::leaky_relu", "aten::leaky_relu_"), _leaky_relu_stub,
     leaky_relu_handler),
    ((F.rrelu, torch.rrelu, "aten::rrelu"), _rrelu_stub, rrelu_handler),
    ((F.prelu, torch.prelu, "prelu", "aten::prelu", "aten::_prelu_kernel"), _prelu_stub,
     prelu_handler),
    ((F.elu, "aten::elu_"), _elu_stub, elu_handler),
    (("aten::elu",), _elu_aten_stub, elu_handler),
    ((F.selu, torch.selu, "aten::selu", "aten::selu_"), _input_stub, selu_handler),
    ((F.celu, torch.celu, "aten::celu", "aten::celu_"), _celu_stub, celu_handler),
    ((F.softplus, "aten::softplus"), _softplus_stub, softplus_handler),
    ((F.logsigmoid, "aten::log_sigmoid"), _input_stub, logsigmoid_handler),
    ((F.softsign,), _input_stub, softsign_handler),
    ((F.tanhshrink,), _input_stub, tanhshrink_handler),
]


def _module_handler(handler, **attrs):
    """A module handler calling `handler` with the module's attributes as arguments."""
    def run(b: Builder, m: nn.Module, x: T, out: torch.Tensor, ctx: Ctx) -> T:
        return handler(b, {"input": x, **{k: getattr(m, v) for k, v in attrs.items()}},
                       out, ctx)
    return run


def _prelu_module_handler(b: Builder, m: nn.PReLU, x: T, out: torch.Tensor, ctx: Ctx) -> T:
    weight = b.param(f"{ctx.layer}.weight", m.weight)
    return prelu_handler(b, {"input": x, "weight": weight}, out, ctx)


MODULES = {
    nn.LeakyReLU: _module_handler(leaky_relu_handler, negative_slope="negative_slope"),
    nn.RReLU: _module_handler(rrelu_handler, lower="lower", upper="upper", training="training"),
    nn.PReLU: _prelu_module_handler, nn.ELU: _module_handler(elu_handler, alpha="alpha"),
    nn.SELU: _module_handler(selu_handler), nn.CELU: _module_handler(celu_handler, alpha="alpha"),
    nn.Softplus: _module_handler(softplus_handler, beta="beta", threshold="threshold"),
    nn.LogSigmoid: _module_handler(logsigmoid_handler),
    nn.Softsign: _module_handler(softsign_handler),
    nn.Tanhshrink: _module_handler(tanhshrink_handler),
}
