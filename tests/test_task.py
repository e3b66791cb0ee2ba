import json

import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.frontend.reference import reference
from raytune_kernels.task import Compute, EpilogueOp, Task, TensorSpec


def conv_compute(epilogue=()):
    return Compute("conv2d", (TensorSpec((1, 8, 10, 10)), TensorSpec((16, 8, 3, 3))),
                   TensorSpec((1, 16, 8, 8)),
                   (("dilation", (1, 1)), ("groups", 1), ("padding", (0, 0)), ("stride", (1, 1))),
                   epilogue)


def test_key_hashes_the_compute():
    a, b = conv_compute(), conv_compute((EpilogueOp("relu"),))
    assert a.key() == conv_compute().key() and a.key() != b.key()
    assert len(a.key()) == 16


def test_task_json_round_trip():
    c = conv_compute((EpilogueOp("bias", (TensorSpec((16,)),), axis=1), EpilogueOp("relu")))
    task = Task(c.key(), c, 2, ("a", "b"))
    again = Task.from_json(json.loads(json.dumps(task.to_json())))
    assert again == task


def test_task_from_json_rejects_a_key_that_does_not_match():
    c = conv_compute()
    d = Task(c.key(), c, 1).to_json()
    d["compute"]["attrs"]["stride"] = [2, 2]
    with pytest.raises(ValueError, match="does not match"):
        Task.from_json(d)


def test_conv_flops():
    assert conv_compute().flops() == 2 * 16 * 8 * 8 * 8 * 3 * 3


def test_reference_applies_epilogue_in_order():
    c = conv_compute((EpilogueOp("bias", (TensorSpec((16,)),), axis=1),
                      EpilogueOp("sub", (TensorSpec((1, 16, 8, 8)),), reverse=True),
                      EpilogueOp("mul", scalar=0.5), EpilogueOp("relu6")))
    x, w, b, r = (torch.randn(1, 8, 10, 10), torch.randn(16, 8, 3, 3), torch.randn(16),
                  torch.randn(1, 16, 8, 8))
    expected = torch.clamp((r - (torch.conv2d(x, w) + b[:, None, None])) * 0.5, 0, 6)
    assert torch.allclose(reference(c, x, w, b, r), expected, atol=1e-5)
    with pytest.raises(ValueError, match="left over"):
        reference(c, x, w, b, r, r)


def test_target_parsing():
    assert str(rk.parse_target("llvm -mcpu=znver3")) == "llvm -mcpu=znver3"
    assert rk.parse_target("cuda").kind == "cuda"
    for bad in ("rocm", "", "llvm -mattr=+avx", "cuda -mcpu=x"):
        with pytest.raises(rk.UnknownTargetError):
            rk.parse_target(bad)


def test_a_cuda_target_carries_its_precision_and_fp32_stays_the_old_string():
    t = rk.parse_target("cuda -precision=bf16 -arch=sm_90")
    assert (t.arch, t.precision) == ("sm_90", "bf16")
    assert str(t) == "cuda -arch=sm_90 -precision=bf16" and rk.parse_target(str(t)) == t
    assert str(rk.parse_target("cuda -arch=sm_80 -precision=fp32")) == "cuda -arch=sm_80"
    with pytest.raises(rk.UnknownTargetError, match="unknown precision 'fp8'"):
        rk.parse_target("cuda -precision=fp8")
    with pytest.raises(rk.UnknownTargetError, match="unknown precision 'tf32' for llvm"):
        rk.parse_target("llvm -precision=tf32")  # a CPU has bf16 (AMX) or fp32
    assert str(rk.parse_target("llvm -precision=bf16")) == "llvm -precision=bf16"


def test_every_layer_implements_exactly_the_op_vocabulary():
    """One list of epilogue op names (task.UNARY_OPS / BINARY_OPS): the graph, the
    reference, the loop-nest interpreter, the LLVM math and the CUDA epilogue each
    implement exactly those, and the interpreter agrees with the reference on each."""
    import numpy as np

    from raytune_kernels.cpu.llvm.math_ops import PARAMETRIC, UNARY
    from raytune_kernels.cpu.loopnest import BINARY_NP, UNARY_NP
    from raytune_kernels.cuda.epilogue import epilogue_lines
    from raytune_kernels.cuda.epilogue import unary as cuda_unary
    from raytune_kernels.frontend.graph import BINARY_OPS as GRAPH_BINARY
    from raytune_kernels.frontend.graph import UNARY_OPS as GRAPH_UNARY
    from raytune_kernels.frontend.reference import BINARY_FNS, UNARY_FNS
    from raytune_kernels.task import BINARY_OPS, UNARY_OPS

    assert len(set(UNARY_OPS)) == len(UNARY_OPS) and len(set(BINARY_OPS)) == len(BINARY_OPS)
    for implemented in (GRAPH_UNARY, UNARY_FNS, UNARY_NP, UNARY):
        assert set(implemented) == set(UNARY_OPS)
    for implemented in (GRAPH_BINARY, BINARY_FNS, BINARY_NP):
        assert set(implemented) == set(BINARY_OPS)
    # the LLVM math's binary ops: four instructions, maximum and minimum, the parametric
    assert set(BINARY_OPS) == {"add", "sub", "mul", "div", "maximum", "minimum"} | set(PARAMETRIC)
    x = torch.linspace(-8, 8, 101)
    for op in UNARY_OPS:
        assert cuda_unary(op, "v")  # renders, or raises naming the op
        np.testing.assert_allclose(UNARY_NP[op](x.double().numpy()), UNARY_FNS[op](x.double()),
                                   rtol=1e-6, atol=1e-6, err_msg=op)
    for op in BINARY_OPS:
        compute = Compute("elementwise", (TensorSpec((101,)),), TensorSpec((101,)),
                          epilogue=(EpilogueOp(op, scalar=0.5),))
        assert epilogue_lines(compute, "v", [])  # renders
        np.testing.assert_allclose(BINARY_NP[op](x.double().numpy(), 0.5),
                                   BINARY_FNS[op](x.double(), torch.tensor(0.5).double()),
                                   rtol=1e-6, atol=1e-6, err_msg=op)
