"""CUDA builder actor: renders and compiles candidates with NVRTC on a CPU worker (NVRTC
needs the CUDA libraries, not a GPU). Returns cubin/PTX bytes or the error, as data."""
from __future__ import annotations

import os

import ray

from raytune_kernels.cuda.build import CudaBuildResult, build_cuda
from raytune_kernels.space import Config
from raytune_kernels.task import Compute


@ray.remote(max_restarts=0, max_task_retries=0)
class CudaBuilderActor:
    """Replaced by the pipeline when its process dies, like the CPU builder (the
    candidate is built again once, then recorded as a build error)."""

    def __init__(self, cores: tuple[int, ...] = ()):
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)

    def ready(self) -> int:
        return os.getpid()

    def build(self, compute: dict, config: dict, arch: str) -> CudaBuildResult:
        return build_cuda(Compute.from_json(compute), Config.from_json(config), arch)
