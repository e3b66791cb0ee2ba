"""compute + cuda config -> CudaKernel (source, launch geometry, buffers): one entry point
per stage for every task kind on target "cuda".

Families: conv2d (any stride, padding, dilation, groups), dense and matmul are tiled GEMMs
(cuda_gemm); depthwise conv and pooling are sliding windows (cuda_window); softmax and
layer norm are row reductions and elementwise tasks a flat map (cuda_rows). All of them
read and write torch's contiguous layouts (cuda_kernel), so cuda_pack / cuda_unpack are
the host side for every kernel. Rendering is a pure function of (compute, config).
"""
from __future__ import annotations

from ..task import Compute
from .cuda_epilogue import CudaLoweringError, epilogue_reason
from .cuda_gemm import gemm_space, render_gemm
from .cuda_gemm_views import gemm_view
from .cuda_kernel import CudaKernel, buffers_of, cuda_pack, cuda_unpack
from .cuda_rows import (ROW_OPS, Rows, elementwise_space, render_elementwise, render_rows,
                        row_reason, row_space)
from .cuda_window import Window, is_window, render_window, window_reason, window_space
from .space import Config, Space

__all__ = ["CudaKernel", "CudaLoweringError", "cuda_pack", "cuda_space_for", "cuda_unpack",
           "render_cuda", "cuda_unsupported_reason"]

GEMM_OPS = ("conv2d", "dense", "matmul")


def cuda_unsupported_reason(compute: Compute) -> str | None:
    """None when the compute renders to CUDA; otherwise why not, in words."""
    bad = [s.dtype for s in (*compute.inputs, compute.output) if s.dtype != "float32"]
    if bad:
        return f"{compute.describe()}: dtype {bad[0]} (the CUDA kernels are float32 only)"
    try:
        reason = _anchor_reason(compute) or epilogue_reason(compute)
        if reason is None:
            buffers_of(compute)
            _space(compute)
    except (CudaLoweringError, ValueError) as exc:
        reason = str(exc)
    return None if reason is None else f"{compute.describe()}: {reason}"


def _anchor_reason(c: Compute) -> str | None:
    if c.op in ROW_OPS:
        return row_reason(c)
    if c.op == "elementwise":
        return None if len(c.inputs) == 1 else "elementwise task with several inputs"
    if is_window(c):
        return window_reason(c)
    if c.op in GEMM_OPS:
        if c.op == "conv2d" and len(c.inputs[0].shape) != 4:
            return "conv2d on a non-4-D input"
        gemm_view(c)  # raises with a reason for shapes it cannot view
        return None
    return f"no CUDA kernel for op '{c.op}'"


def cuda_space_for(compute: Compute) -> Space:
    """The GPU schedule space of a compute (raises CudaLoweringError when unsupported)."""
    reason = cuda_unsupported_reason(compute)
    if reason:
        raise CudaLoweringError(reason)
    return _space(compute)


def _space(compute: Compute) -> Space:
    if compute.op in ROW_OPS:
        return row_space(Rows.from_compute(compute))
    if compute.op == "elementwise":
        return elementwise_space(compute)
    if is_window(compute):
        return window_space(Window.from_compute(compute))
    return gemm_space(gemm_view(compute))


def render_cuda(compute: Compute, cfg: Config) -> CudaKernel:
    """CUDA C and launch geometry of one config; a config outside the compute's space
    raises CudaLoweringError naming the knobs that are wrong."""
    space = cuda_space_for(compute)
    problem = config_problem(space, cfg)
    if problem:
        raise CudaLoweringError(f"bad cuda config for {compute.describe()}: {problem}")
    if compute.op in ROW_OPS:
        return render_rows(compute, Rows.from_compute(compute), cfg)
    if compute.op == "elementwise":
        return render_elementwise(compute, cfg)
    if is_window(compute):
        return render_window(compute, Window.from_compute(compute), cfg)
    return render_gemm(compute, gemm_view(compute), cfg)


def config_problem(space: Space, cfg: Config) -> str | None:
    """None when cfg is a point of space; else what is wrong with it, in words."""
    have = dict(cfg.knobs)
    names = set(space.coupled_names) | {n for n, _ in space.independent}
    missing, extra = sorted(names - set(have)), sorted(set(have) - names)
    if missing or extra:
        return f"missing knobs {missing}, unknown knobs {extra}"
    for name, choices in space.independent:
        if have[name] not in choices:
            return f"{name}={have[name]!r} is not one of {choices}"
    combo = tuple(have[n] for n in space.coupled_names)
    if combo not in space.coupled:
        pairs = ", ".join(f"{n}={v!r}" for n, v in zip(space.coupled_names, combo))
        return f"({pairs}) is not a valid combination of these knobs"
    return None
