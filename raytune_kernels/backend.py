"""A target's code generator as one value: what it can lower, its schedule spaces, the
layouts a config reads and writes, the cost model's features, the analytic estimate when
there is one, and how operands travel to and from its buffers.

Everything above the backends (the search, the cost model, the tuner, the actors, the
driver) asks the Backend instead of branching on the target's kind; `backend_for` and
`platform_for` are the places that do. A Backend holds module-level functions (some bound
to the device by functools.partial), so it pickles and travels to actors as it is.

A Platform is what a target asks of the machines before its Backend can exist (a cuda
Backend waits for the measuring GPU's arch): the driver's checks before any work, and the
CPU that measures, where the driver is the one to describe it.

Build and measure are not fields: they run in the builder and measurer actors, which the
pipeline starts per device (actors/pipeline.py), and the compiled network has its own
entry per backend (compile/api.py).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from raytune_kernels.cpu.amx import precision_problem
from raytune_kernels.cpu.estimate import cycles
from raytune_kernels.cpu.features import featurize, featurize_nest
from raytune_kernels.cpu.machine import CpuInfo, cpu_info, host_device
from raytune_kernels.cpu.probe import unusable_mcpu
from raytune_kernels.cpu.schedules import lower, no_kernel_reason, pack, space_for, unpack
from raytune_kernels.cuda.build import nvrtc_unavailable
from raytune_kernels.cuda.features import featurize_cuda
from raytune_kernels.cuda.gpu import GpuInfo, arch_has_mma, gpu_info
from raytune_kernels.cuda.render import (cuda_layouts, cuda_pack, cuda_space_for, cuda_unpack,
                                         cuda_unsupported_reason, default_config,
                                         fill_seed, split_seed)
from raytune_kernels.errors import UnknownTargetError
from raytune_kernels.layout.costs import layouts_of
from raytune_kernels.precision import DEFAULT
from raytune_kernels.space import Config, Space, UnionSpace
from raytune_kernels.target import Target, parse_target
from raytune_kernels.task import Compute, Task

if TYPE_CHECKING:
    import torch

# (features, one row per config; estimated cost, lower is faster, or None without one)
Analysis = tuple[np.ndarray | None, np.ndarray | None]


def no_seeds(compute: Compute) -> list[Config]:
    """A backend's seeds where nothing runs untuned first (the CPU's estimate guides the
    first proposal instead)."""
    return []


@dataclass(frozen=True)
class Backend:
    kind: str  # "llvm" or "cuda", as in the target string
    device: CpuInfo | GpuInfo  # what the spaces, features and estimate are sized for
    unsupported: Callable[[Compute], str | None]  # None, or why no kernel exists
    space: Callable[[Compute], Space | UnionSpace]
    layouts: Callable[[Task, Config], tuple[str, str]]  # (input, output) layout labels
    featurize: Callable[[Compute, Config], list[float]]  # the cost model's features
    # analyze(compute, cfgs, features=True): the features and the estimate of a batch,
    # sharing one lowering per config; the search's guides (see tune/search.py)
    analyze: Callable[..., Analysis]
    has_estimate: bool  # whether analyze returns an estimated cost
    pack: Callable[[Compute, Config, list[torch.Tensor]], object]  # operands -> buffers
    unpack: Callable[[Compute, Config, object], torch.Tensor]  # output buffer -> tensor
    # configs a task's search measures first, before any other: what runs untuned
    seeds: Callable[[Compute], list[Config]] = no_seeds


def cpu_backend(cpu: CpuInfo, threads: int = 1, precision: str = DEFAULT) -> Backend:
    """Loop nests rendered to LLVM IR for `cpu` (its vector widths, registers and
    measured machine model); the estimate prices configs at the `threads` the tuner
    measures them with. In bf16, convolutions, denses and matmuls also run on AMX tiles,
    which the CPU must have."""
    problem = precision_problem(cpu, precision)
    if problem:
        raise UnknownTargetError(problem)
    return Backend("llvm", cpu, functools.partial(no_kernel_reason, cpu=cpu,
                                                  precision=precision),
                   functools.partial(_cpu_space, cpu=cpu, precision=precision),
                   layouts_of, functools.partial(featurize, cpu=cpu),
                   functools.partial(_cpu_analyze, cpu=cpu, threads=threads), True, pack,
                   unpack)


def cuda_backend(gpu: GpuInfo, precision: str = DEFAULT) -> Backend:
    """CUDA C rendered per config, compiled by NVRTC for `gpu`'s arch, in `precision`
    (tensor cores, which need sm_80 or newer, where it is not fp32); no analytic estimate
    (the search explores at random until the cost model has learnt, after measuring the
    config an untuned task runs: a task tuned for one trial runs what it would untuned)."""
    if precision != DEFAULT and not arch_has_mma(gpu.arch):
        raise UnknownTargetError(f"precision {precision} runs on tensor cores (mma.sync "
                                 f"with tf32, fp16 or bf16), which {gpu.arch} lacks: "
                                 "they need sm_80 or newer")
    return Backend("cuda", gpu, cuda_unsupported_reason,
                   functools.partial(cuda_space_for, precision=precision), _cuda_layouts,
                   functools.partial(featurize_cuda, gpu=gpu),
                   functools.partial(_cuda_analyze, gpu=gpu), False, _cuda_pack, _cuda_unpack,
                   functools.partial(_cuda_seeds, precision=precision, gpu=gpu))


def backend_for(target: str | Target, device: CpuInfo | GpuInfo | None = None,
                threads: int = 1) -> Backend:
    """The backend of a target string. An "llvm" target is sized for the host CPU (or its
    -mcpu), its estimate at `threads`; a "cuda" target for its -arch, or for `device`
    (the measuring GPU's figures) when the target names no arch."""
    tgt = parse_target(target)
    if tgt.kind == "llvm":
        return cpu_backend(device if isinstance(device, CpuInfo) else cpu_info(tgt.mcpu),
                           threads, tgt.precision)
    if tgt.kind == "cuda":
        if isinstance(device, GpuInfo):
            return cuda_backend(device, tgt.precision)
        if not tgt.arch:
            raise UnknownTargetError(f"target {str(tgt)!r} names no arch: give "
                                     "'cuda -arch=sm_XY' or the measuring GPU's figures")
        return cuda_backend(gpu_info(tgt.arch), tgt.precision)
    raise UnknownTargetError(f"no backend for target kind {tgt.kind!r}")


# (target, threads, num_measurers) -> why tuning cannot go ahead, or None
Check = Callable[[Target, int, "int | None"], "str | None"]


@dataclass(frozen=True)
class Platform:
    """What tuning for a target kind asks of the machines (see the module docstring)."""

    on_gpu: bool  # measures on the cluster's GPUs, one candidate at a time each
    refuses: Check  # options or a target this kind cannot take
    lacks_here: Check  # what this machine lacks to build and measure on its own
    # (the CPU code is built for, the measuring CPU's name, its vector ISA): what records
    # say measured them; None where the measurer names itself (a GPU)
    measuring_cpu: Callable[[Target], "tuple[CpuInfo, str, str] | None"]


def platform_for(target: str | Target) -> Platform:
    """The Platform of a target string (its kind's)."""
    tgt = parse_target(target)
    if tgt.kind == "llvm":
        return Platform(False, _cpu_refuses, _cpu_lacks, _measuring_cpu)
    if tgt.kind == "cuda":
        return Platform(True, _cuda_refuses, _cuda_lacks, _no_cpu)
    raise UnknownTargetError(f"no backend for target kind {tgt.kind!r}")


def unsupported_on(target: str | Target) -> Callable[[Compute], str | None]:
    """Why a target's backend has no kernel for a compute (None when it has one), known
    before any GPU is asked: on a CPU, also a space that comes out empty on it."""
    tgt = parse_target(target)
    return cuda_unsupported_reason if tgt.kind == "cuda" else backend_for(tgt).unsupported


def _cpu_refuses(tgt: Target, threads: int, num_measurers: int | None) -> str | None:
    return unusable_mcpu(tgt.mcpu)


def _cpu_lacks(tgt: Target, threads: int, num_measurers: int | None) -> str | None:
    """CPU measurers own `threads` cores each: this machine must have them all."""
    cores = len(os.sched_getaffinity(0))
    if (num_measurers or 1) * threads > cores:
        return (f"{num_measurers or 1} measurer(s) x {threads} thread(s) need more cores "
                f"than this machine gives us ({cores})")
    return None


def _measuring_cpu(tgt: Target) -> tuple[CpuInfo, str, str]:
    # with -mcpu=X, code for X is timed on this host: records name the host
    return (cpu_info(tgt.mcpu), *host_device())


def _cuda_refuses(tgt: Target, threads: int, num_measurers: int | None) -> str | None:
    if threads != 1 or num_measurers is not None:
        return ("threads and num_measurers are CPU options; a cuda target measures on every "
                "GPU of the cluster, one candidate at a time each")
    return None


def _cuda_lacks(tgt: Target, threads: int, num_measurers: int | None) -> str | None:
    reason = nvrtc_unavailable()
    return f"it compiles with NVRTC, which is not usable here: {reason}" if reason else None


def _no_cpu(tgt: Target) -> None:
    return None


def _cpu_space(compute: Compute, cpu: CpuInfo, precision: str = DEFAULT
               ) -> Space | UnionSpace:
    return space_for(compute, cpu, precision)


def _cpu_analyze(compute: Compute, cfgs: list[Config], features: bool = True,
                 cpu: CpuInfo | None = None, threads: int = 1) -> Analysis:
    nests = [lower(compute, c) for c in cfgs]
    x = np.asarray([featurize_nest(compute, c, n, cpu) for c, n in zip(cfgs, nests)],
                   dtype=np.float32).reshape(len(cfgs), -1) if features else None
    return x, np.asarray([cycles(n, cpu.machine, threads) for n in nests], dtype=np.float64)


def _cuda_layouts(task: Task, cfg: Config) -> tuple[str, str]:
    return cuda_layouts(task.compute, cfg)


def _cuda_analyze(compute: Compute, cfgs: list[Config], features: bool = True,
                  gpu: GpuInfo | None = None) -> Analysis:
    if not features:
        return None, None
    return np.asarray([featurize_cuda(compute, c, gpu) for c in cfgs],
                      dtype=np.float32).reshape(len(cfgs), -1), None


def _cuda_seeds(compute: Compute, precision: str, gpu: GpuInfo) -> list[Config]:
    """What an untuned task runs, and beside it: with tensor cores, a convolution's small
    blocks in the other layout (the layout plan weighs a record of each); in fp32, the
    default with split-K where its grid is small."""
    default = default_config(compute, precision, gpu.sms)
    if default.get("kernel") == "mma":
        second = fill_seed(compute, precision, gpu.sms, "NCHW") \
            if default.get("layout") is not None else None
    else:
        second = split_seed(compute, default, gpu.sms)
    return [default] + ([second] if second not in (None, default) else [])


def _cuda_pack(compute: Compute, cfg: Config, operands) -> list[np.ndarray]:
    return cuda_pack(compute, operands, cfg)


def _cuda_unpack(compute: Compute, cfg: Config, flat) -> torch.Tensor:
    return cuda_unpack(compute, flat, cfg)
