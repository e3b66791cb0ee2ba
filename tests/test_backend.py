"""backend_for: one object per target, and what each backend gives the search."""
import pickle
import random

import numpy as np
import pytest
import torch

from raytune_kernels.backend import backend_for, cpu_backend, cuda_backend, unsupported_on
from raytune_kernels.cpu.machine import CpuInfo, assumed_model
from raytune_kernels.cpu.schedules import lower, space_for
from raytune_kernels.cpu.estimate import cycles
from raytune_kernels.cuda.features import featurize_cuda
from raytune_kernels.cuda.gpu import GpuInfo, gpu_info
from raytune_kernels.cuda.render import cuda_space_for, cuda_unsupported_reason
from raytune_kernels.errors import UnknownTargetError
from raytune_kernels.frontend.reference import reference
from raytune_kernels.task import Compute, TensorSpec
from tests.support.cuda_cases import CASES

CPU = CpuInfo("test", (16, 8), 32, assumed_model("test", (16, 8)))


def _dense() -> Compute:
    return Compute("dense", (TensorSpec((4, 64)), TensorSpec((32, 64))), TensorSpec((4, 32)))


def _configs(space, n: int = 5):
    rng = random.Random(0)
    return list(dict.fromkeys(space.sample(rng) for _ in range(4 * n)))[:n]


def test_the_target_picks_the_backend():
    c = CASES["dense_bias_gelu"]
    assert backend_for("cuda -arch=sm_90").space(c) == cuda_space_for(c)
    assert backend_for("cuda -arch=sm_80").device == gpu_info("sm_80")
    assert backend_for("cuda", gpu_info("sm_86")).device.arch == "sm_86"
    llvm = backend_for("llvm", CPU)
    assert llvm.kind == "llvm" and "lanes" in llvm.space(c).coupled_names
    assert backend_for("llvm").device.lanes  # the host CPU
    with pytest.raises(UnknownTargetError, match="names no arch"):
        backend_for("cuda")
    with pytest.raises(UnknownTargetError):
        backend_for("rocm")
    assert unsupported_on("cuda") is cuda_unsupported_reason
    assert unsupported_on("llvm")(c) is None


def test_the_cpu_backend_analyzes_with_one_lowering_and_estimates():
    backend, c = cpu_backend(CPU), _dense()
    assert backend.space(c) == space_for(c, CPU) and backend.has_estimate
    cfgs = _configs(backend.space(c))
    x, cost = backend.analyze(c, cfgs)
    assert x.shape[0] == len(cfgs) and x.dtype == np.float32
    np.testing.assert_allclose(x, [backend.featurize(c, cfg) for cfg in cfgs], rtol=1e-6)
    assert list(cost) == [cycles(lower(c, cfg), CPU.machine) for cfg in cfgs]
    none, cost_only = backend.analyze(c, cfgs, features=False)
    assert none is None and list(cost_only) == list(cost)


def test_the_cuda_backend_has_features_and_no_estimate():
    gpu = gpu_info("sm_90")
    backend, c = cuda_backend(gpu), CASES["softmax_last"]
    cfgs = _configs(backend.space(c))
    x, cost = backend.analyze(c, cfgs)
    assert cost is None and not backend.has_estimate
    assert x.tolist() == [pytest.approx(featurize_cuda(c, cfg, gpu)) for cfg in cfgs]
    assert backend.analyze(c, cfgs, features=False) == (None, None)
    small = GpuInfo("sm_90", 66, gpu.smem_per_sm, 2048, 32)
    assert cuda_backend(small).featurize(c, cfgs[0]) != backend.featurize(c, cfgs[0])


def test_pack_and_unpack_go_through_either_backend():
    c = _dense()
    ops = [torch.randn(s.shape) for s in c.inputs]
    want = reference(c, *ops)
    for backend in (cpu_backend(CPU), cuda_backend(gpu_info("sm_90"))):
        cfg = backend.space(c).sample(random.Random(1))
        packed = backend.pack(c, cfg, ops)
        out = packed["out"] if backend.kind == "llvm" else packed[-1]
        got = backend.unpack(c, cfg, out)
        assert got.shape == want.shape and not got.any()  # the zeroed output buffer


def test_a_backend_travels_to_actors_by_pickle():
    for backend in (cpu_backend(CPU), cuda_backend(gpu_info("sm_90"))):
        again = pickle.loads(pickle.dumps(backend))
        c = _dense()
        cfg = backend.space(c).sample(random.Random(0))
        assert again.featurize(c, cfg) == backend.featurize(c, cfg)


def test_a_space_that_comes_out_empty_is_a_reason_not_a_crash():
    """A CPU on which no register tile fits a task: the backend names why, so the tuner
    skips the task (and the compiled network runs PyTorch's kernel for it)."""
    dense = _dense()
    cramped = CpuInfo("cramped", (8,), 2, assumed_model("cramped", (8,)))
    assert "no register tile fits dense" in cpu_backend(cramped).unsupported(dense)
    assert cpu_backend(CPU).unsupported(dense) is None


def test_the_driver_skips_tasks_without_a_kernel_with_a_warning(monkeypatch):
    from actors import driver
    from raytune_kernels.task import Task

    cramped = CpuInfo("cramped", (8,), 2, assumed_model("cramped", (8,)))
    monkeypatch.setattr(driver, "unsupported_on", lambda tgt: cpu_backend(cramped).unsupported)
    dense = Task("k", _dense(), 1, ("fc",))
    with pytest.warns(UserWarning, match=r"not tuned for llvm .*no register tile fits"):
        assert driver._tunable([dense], driver.parse_target("llvm")) == ([], [dense])


def test_an_epilogue_operand_the_row_kernel_cannot_read_is_a_reason():
    """(maxvit_t's relative-position bias on attention rows): named, not raised later."""
    from raytune_kernels.cpu.schedules import no_kernel_reason
    from raytune_kernels.task import EpilogueOp

    x = TensorSpec((4, 2, 49, 49))  # windows x heads x rows x row; a bias shared by windows
    odd = Compute("softmax", (x,), x, (("dim", 3),),
                  (EpilogueOp("add", (TensorSpec((1, 2, 49, 49)),)),))
    assert "epilogue operand" in no_kernel_reason(odd, CPU)
