"""Small computes covering every CUDA kernel family, attribute and epilogue op: small
enough that the CPU emulator (one thread per CUDA thread) runs them in well under a second,
and shaped so that tiles are ragged, vector loads are legal for some and not others."""
from __future__ import annotations

import torch

from raytune_kernels.frontend.reference import reference
from raytune_kernels.task import Compute, EpilogueOp, TensorSpec


def _spec(shape) -> TensorSpec:
    return TensorSpec(tuple(shape))


def make(op: str, inputs, attrs: dict | None = None, epilogue=()) -> Compute:
    """A compute whose output shape is what the reference gives; `epilogue` is a list of
    callables out_shape -> EpilogueOp."""
    attrs = tuple(sorted((attrs or {}).items()))
    specs = tuple(_spec(s) for s in inputs)
    probe = Compute(op, specs, _spec(()), attrs)
    with torch.no_grad():
        out = tuple(reference(probe, *(torch.ones(s.shape) for s in specs)).shape)
    return Compute(op, specs, _spec(out), attrs, tuple(e(out) for e in epilogue))


# epilogue steps, as functions of the output shape
def bias(axis=1):
    return lambda out: EpilogueOp("bias", (_spec((out[axis],)),), axis=axis)


def affine(axis=1):
    return lambda out: EpilogueOp("affine", (_spec((out[axis],)),) * 2, axis=axis)


def residual(op="add", reverse=False):
    return lambda out: EpilogueOp(op, (_spec(out),), reverse=reverse)


def broadcast(shape, op="mul"):
    return lambda out: EpilogueOp(op, (_spec(shape),))


def scalar(op, value, reverse=False):
    return lambda out: EpilogueOp(op, (), value, reverse)


def unary(name):
    return lambda out: EpilogueOp(name)


def conv(x, k, ks, stride=1, pad=0, dil=1, groups=1, epilogue=()) -> Compute:
    w = (k, x[1] // groups, ks, ks)
    return make("conv2d", (x, w), {"stride": (stride,) * 2, "padding": (pad,) * 2,
                                   "dilation": (dil,) * 2, "groups": groups}, epilogue)


def pool(op, x, ks, stride, pad=0, ceil=False, count_pad=True, dil=1) -> Compute:
    attrs = {"kernel": (ks, ks), "stride": (stride,) * 2, "padding": (pad,) * 2,
             "ceil_mode": ceil}
    if op == "max_pool2d":
        attrs["dilation"] = (dil,) * 2
    else:
        attrs["count_include_pad"] = count_pad
    return make(op, (x,), attrs)


CASES: dict[str, Compute] = {
    "conv3x3_bias_relu": conv((1, 8, 10, 10), 16, 3, 1, 1, epilogue=(bias(), unary("relu"))),
    "conv_batch2_s2_residual": conv((2, 8, 9, 9), 16, 3, 2, 1,
                                    epilogue=(bias(), residual(), unary("relu"))),
    "conv_dilated_gelu_tanh": conv((1, 8, 12, 12), 8, 3, 1, 2, dil=2,
                                   epilogue=(unary("gelu_tanh"),)),
    "conv1x1_channel_mul_silu": conv((1, 16, 8, 8), 32, 1,
                                     epilogue=(bias(), broadcast((1, 32, 1, 1)), unary("silu"))),
    "conv_grouped_affine_tanh": conv((1, 8, 8, 8), 16, 3, 1, 1, groups=2,
                                     epilogue=(affine(), unary("tanh"))),
    "conv_spatial_broadcasts": conv((2, 8, 6, 5), 8, 3, 1, 1,  # every output coordinate
                                    epilogue=(broadcast((1, 1, 6, 5)),
                                              broadcast((2, 1, 1, 1), "add"))),
    "conv7x7_stem": conv((1, 3, 16, 16), 8, 7, 2, 3, epilogue=(bias(), unary("relu"))),
    "conv1x1_s2": conv((1, 12, 7, 7), 24, 1, 2, epilogue=(bias(), residual(), unary("relu"))),
    "depthwise_relu6": conv((1, 16, 10, 10), 16, 3, 1, 1, groups=16,
                            epilogue=(bias(), unary("relu6"))),
    "depthwise_x2_s2_sigmoid": conv((1, 8, 9, 9), 16, 3, 2, 1, groups=8,
                                    epilogue=(unary("sigmoid"),)),
    "depthwise_hardswish": conv((1, 16, 10, 10), 16, 3, 1, 1, groups=16,
                                epilogue=(bias(), unary("hardswish"))),
    "conv1x1_hardsigmoid": conv((1, 8, 6, 6), 16, 1, epilogue=(bias(), unary("hardsigmoid"))),
    "maxpool3x3_s2": pool("max_pool2d", (1, 8, 9, 9), 3, 2, 1),
    "maxpool_dilated": pool("max_pool2d", (1, 4, 9, 9), 3, 1, 1, dil=2),
    "avgpool2x2": pool("avg_pool2d", (1, 8, 8, 8), 2, 2),
    "avgpool_ceil_nopad_count": pool("avg_pool2d", (1, 4, 7, 7), 3, 2, 1, ceil=True,
                                     count_pad=False),
    "avgpool_global": pool("avg_pool2d", (1, 40, 7, 7), 7, 7),
    "adaptive_avgpool": make("adaptive_avg_pool2d", ((1, 4, 7, 7),), {"output_size": (3, 3)}),
    "dense_bias_gelu": make("dense", ((1, 24), (37, 24)), epilogue=(bias(1), unary("gelu"))),
    "dense_narrow_head": make("dense", ((1, 16), (10, 16)), epilogue=(bias(1),)),  # M=1, N=10
    # a reduction long enough for every split-K factor (a batch-1 network's late layers)
    "dense_long_k": make("dense", ((2, 512), (24, 512)), epilogue=(bias(1), unary("relu"))),
    "dense_3d_residual": make("dense", ((2, 5, 16), (20, 16)),
                              epilogue=(bias(2), residual())),
    "matmul_batched_div": make("matmul", ((2, 3, 8, 12), (2, 3, 12, 16)),
                               epilogue=(scalar("div", 8.0),)),
    "matmul_broadcast_rsub": make("matmul", ((3, 5, 6), (6, 7)),
                                  epilogue=(scalar("sub", 2.0, reverse=True),)),
    "softmax_last": make("softmax", ((2, 3, 10),), {"dim": 2}),
    "softmax_axis1": make("softmax", ((2, 6, 4, 5),), {"dim": 1},
                          epilogue=(scalar("mul", 3.0),)),
    "layer_norm": make("layer_norm", ((4, 24), (24,), (24,)),
                       {"normalized_shape": (24,), "eps": 1e-5}, (residual(),)),
    "softmax_long_rows": make("softmax", ((3, 300),), {"dim": 1}),  # several warps
    "layer_norm_long_rows": make("layer_norm", ((2, 260), (260,), (260,)),
                                 {"normalized_shape": (260,), "eps": 1e-5}),
    "layer_norm_2d": make("layer_norm", ((2, 3, 4, 6), (4, 6), (4, 6)),
                          {"normalized_shape": (4, 6), "eps": 1e-6}),
    "reduce_mean_rsqrt": make("reduce", ((2, 5, 24),), {"kind": "mean"},
                              (unary("abs"), scalar("add", 1e-5), unary("rsqrt"))),
    "reduce_sum_residual": make("reduce", ((3, 300),), {"kind": "sum"}, (residual(),)),
    "reduce_max": make("reduce", ((4, 7, 33),), {"kind": "max"}),
    "reduce_min_long_rows": make("reduce", ((2, 1030),), {"kind": "min"}),
    "elementwise_affine_relu": make("elementwise", ((1, 6, 5, 5),),
                                    epilogue=(affine(), unary("relu"))),
    "elementwise_chain": make("elementwise", ((4, 16),),
                              epilogue=(residual("sub", reverse=True), unary("sigmoid"),
                                        scalar("div", 1.5, reverse=True))),
    "elementwise_broadcast": make("elementwise", ((2, 3, 4),),
                                  epilogue=(broadcast((3, 1), "add"), unary("tanh"),
                                            residual("div"))),
    # 1-D convolutions, as the frontend gives them: height 1, a 1 x k kernel
    "conv1d_s2_bias_gelu": make("conv2d", ((1, 8, 1, 21), (16, 8, 1, 5)),
                                {"stride": (1, 2), "padding": (0, 2), "dilation": (1, 1),
                                 "groups": 1}, (bias(), unary("gelu"))),
    "conv1d_depthwise_dilated": make("conv2d", ((1, 16, 1, 19), (16, 1, 1, 3)),
                                     {"stride": (1, 1), "padding": (0, 2), "dilation": (1, 2),
                                      "groups": 16}, (bias(), unary("silu"))),
    # activations with a parameter: PReLU's per-channel slopes, LeakyReLU's and ELU's scalar
    "conv1x1_prelu_channels": conv((1, 8, 6, 6), 16, 1,
                                   epilogue=(bias(), broadcast((1, 16, 1, 1), "prelu"))),
    "dense_leaky_elu_softplus": make("dense", ((3, 24), (20, 24)),
                                     epilogue=(bias(1), scalar("prelu", 0.1),
                                               scalar("elu", 1.3), unary("softplus"))),
    "elementwise_elu_channels": make("elementwise", ((1, 6, 5, 5),),
                                     epilogue=(broadcast((1, 6, 1, 1), "elu"),
                                               unary("softplus"))),
}
