"""GPU measurer actor: one per GPU, a few lines over the Ray-free core (cuda/measure.py).

A candidate that faults on the GPU poisons the process's CUDA context: every later call
would fail. The actor returns that candidate's CRASHED result, then ends its process
(os._exit, after a short grace so the reply gets out) and Ray restarts it with a fresh
context (max_restarts=-1). A call that reaches the poisoned process in the meantime ends
it at once, before doing any work; max_task_retries=1 re-runs that call on the restarted
actor, so the next candidate is measured, not blamed. A candidate that kills the process
outright is retried once and then reaches the caller as RayActorError (recorded crashed).
"""
from __future__ import annotations

import os
import threading
from typing import Callable

import ray

from raytune_kernels.space import Config
from raytune_kernels.measure import CRASHED, MeasureOptions, MeasureResult
from raytune_kernels.cuda.device import device_arch, device_name
from raytune_kernels.cuda.measure import measure_built_gpu
from raytune_kernels.task import Compute

EXIT_GRACE_S = 0.5


@ray.remote(num_gpus=1, max_restarts=-1, max_task_retries=1)
class GpuMeasurerActor:
    """Measures one CUDA candidate at a time on the GPU Ray assigned it (device 0 of
    its CUDA_VISIBLE_DEVICES). `measure` is the core function; tests pass a fake."""

    def __init__(self, opts: MeasureOptions,
                 measure: Callable[..., MeasureResult] = measure_built_gpu):
        self.opts, self._measure, self._poisoned = opts, measure, False

    def _refuse_if_poisoned(self) -> None:
        if self._poisoned:
            os._exit(1)  # the context is unusable: let Ray restart us and retry this call

    def ready(self) -> int:
        self._refuse_if_poisoned()
        return os.getpid()

    def arch(self) -> str:
        """The arch builders must target for this measurer's GPU, e.g. "sm_90"."""
        self._refuse_if_poisoned()
        return device_arch()

    def name(self) -> str:
        """This measurer's GPU by its product name (records name their device)."""
        self._refuse_if_poisoned()
        return device_name()

    def measure(self, compute: dict, config: dict, binary: bytes, build_s: float) -> dict:
        self._refuse_if_poisoned()
        result = self._measure(Compute.from_json(compute), Config.from_json(config), binary,
                               self.opts, build_s)
        if result.error_kind == CRASHED:
            self._poisoned = True
            threading.Timer(EXIT_GRACE_S, os._exit, (1,)).start()
        return result.to_json()
