"""Builder and measurer actors: a few lines each over the Ray-free core."""
from __future__ import annotations

import os

import ray

from raytune_kernels.cpu.build import BuildResult, sweep_stale_dirs
from raytune_kernels.cpu.faults import maybe_inject
from raytune_kernels.cpu.kernel import build_for
from raytune_kernels.space import Config
from raytune_kernels.cpu.measure import measure_built
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.task import Compute


def pin_cores(cores: tuple[int, ...]) -> None:
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def _node_cores(index: int, count: int) -> tuple[int, ...]:
    """Core block `index` of `count` cores among the cores this node gives us."""
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return tuple(mine[index * count:(index + 1) * count])


@ray.remote(max_restarts=0, max_task_retries=0)
class BuilderActor:
    """Renders and compiles candidates; returns library bytes or the build error. When its
    process dies (an LLVM abort, the OOM killer) the pipeline puts a fresh builder in its
    place (not Ray's restart of this one: calls to a restarting actor can stall), builds
    the candidate again once, and records a second death as that candidate's."""

    def __init__(self, cores: tuple[int, ...] = ()):
        pin_cores(cores)

    def ready(self) -> int:
        return os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def build(self, compute: dict, config: dict, mcpu: str | None) -> BuildResult:
        c, cfg = Compute.from_json(compute), Config.from_json(config)
        return maybe_inject(c, cfg, build_for(c, cfg, mcpu))  # chaos runs only


@ray.remote(max_restarts=-1, max_task_retries=0)
class MeasurerActor:
    """Owns a set of cores (affinity set in its own process) and measures one candidate at
    a time on them. A candidate that crashes the process kills this actor; Ray restarts it."""

    def __init__(self, cores: tuple[int, ...] | None, opts: MeasureOptions,
                 block: tuple[int, int] = (0, 1)):
        """Pinned to `cores`, or (on a cluster node) to core block `block` = (index,
        count) of the cores that node gives its processes."""
        cores = _node_cores(*block) if cores is None else cores
        pin_cores(cores)
        sweep_stale_dirs()  # what a measurer killed by its candidate left behind
        import torch

        torch.set_num_threads(max(1, len(cores)))
        self.opts, self.cores = opts, cores

    def ready(self) -> int:
        return os.getpid()

    def where(self) -> tuple[str, tuple[int, ...]]:
        return ray.get_runtime_context().get_node_id(), self.cores

    def measure(self, compute: dict, config: dict, library: bytes, build_s: float) -> dict:
        result = measure_built(Compute.from_json(compute), Config.from_json(config), library,
                               self.opts, build_s)
        return result.to_json()
