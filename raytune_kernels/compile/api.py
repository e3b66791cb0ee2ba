"""compile_network(), one call for every target. The records are resolved here, once, for
either network (cpu_records, cuda_records), then handed to the target's network compiler
(cpu_network for llvm, cuda_network for cuda). Also the tuner's view of what a network
leaves to PyTorch on a target (pytorch_part_seconds)."""
from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Iterable, Sequence

import torch

from raytune_kernels.compile.artifact import open_state
from raytune_kernels.compile.choose import Solver
from raytune_kernels.compile.cpu_network import (CompiledNetwork, compile_network_cpu,
                                                 island_seconds, torch_seconds)
from raytune_kernels.compile.cuda_network import GpuNetwork, compile_network_cuda, target_arch
from raytune_kernels.cpu.machine import host_device
from raytune_kernels.errors import CompileError
from raytune_kernels.frontend.partition import Partition
from raytune_kernels.layout.problem import solve_ilp
from raytune_kernels.precision import DEFAULT
from raytune_kernels.target import Target, parse_target
from raytune_kernels.task import Task
from raytune_kernels.tune.records import (Record, describe_devices, describe_location,
                                          load_records, measured_on, missing_records,
                                          other_devices)


def compile_network(model: torch.nn.Module,
                    example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                    records: "str | Iterable[Record] | None" = None, *, target: str = "llvm",
                    fallback: str | None = None, threads: int = 1, layout: str = "ilp",
                    time_limit_s: float = 20.0, check: bool = True,
                    atol: float | None = None, verbose: bool = False,
                    solver: Solver = solve_ilp, graph: bool = True, refine: int = 8,
                    rewrites: bool = True):
    """raytune_kernels.compile_network (its parameters, documented there), without asking
    for a Ray session's solver: `solver` is PuLP/CBC in this process unless given."""
    if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
        raise CompileError(f"refine must be a count of records (0: off), got {refine!r}")
    tgt = parse_target(target)
    if tgt.kind == "cuda":
        arch = target_arch(tgt)
        recs = cuda_records(records, arch, plain_ok=tgt.arch is None, precision=tgt.precision)
        return compile_network_cuda(model, example_inputs, recs,
                                    dataclasses.replace(tgt, arch=arch), fallback=fallback,
                                    check=check, atol=atol, verbose=verbose, layout=layout,
                                    time_limit_s=time_limit_s, solver=solver, graph=graph,
                                    rewrites=rewrites)
    if tgt.kind != "llvm":
        raise CompileError(f"target {target!r}: no network compiler for this target kind")
    return compile_network_cpu(model, example_inputs, cpu_records(records, str(tgt), threads),
                               tgt, fallback=fallback, threads=threads, layout=layout,
                               time_limit_s=time_limit_s, check=check,
                               atol=atol, verbose=verbose,
                               solver=solver, refine=refine)


def cpu_records(records: "str | Iterable[Record] | None", target: str,
                threads: int) -> list[Record]:
    """The records of this target and thread count measured on this CPU (name and vector
    ISA). Records measured elsewhere are skipped with one warning that counts them; if
    they are all there is, the compile is refused, naming the devices the records hold."""
    loaded, where = _loaded(records)
    mine = on_this_device(loaded, where, host_device(),
                          lambda r: r.target == target and r.threads == threads,
                          f"target {target!r} at {threads} thread(s)")
    cold = {r.task_key for r in mine if r.cold_weights}
    # a task timed with cold weights is compared only with cold timings of itself
    return [r for r in mine if r.cold_weights or r.task_key not in cold]


def cuda_records(records: "str | Iterable[Record] | None", arch: str, plain_ok: bool,
                 precision: str = DEFAULT) -> list[Record]:
    """The records measured for `arch` in `precision` ("cuda -arch=ARCH[ -precision=P]";
    plain "cuda" ones of that precision too when `plain_ok`: the caller's GPU is the arch
    they were measured on). A record of another precision is never taken."""
    loaded, where = _loaded(records)
    wanted = {str(Target("cuda", arch=arch, precision=precision))}
    wanted |= {str(Target("cuda", precision=precision))} if plain_ok else set()
    mine = [r for r in loaded if r.target in wanted]
    others = sorted({r.target for r in loaded if r.target.startswith("cuda")} - wanted)
    if others and not mine:
        raise CompileError(f"{where} holds no cuda record for {arch} in {precision}, only "
                           f"for {', '.join(others)}: tune this target, or compile for "
                           "theirs")
    return mine


def on_this_device(records: list[Record], where: str, device: tuple[str, str | None],
                   wanted: Callable[[Record], bool], what: str) -> list[Record]:
    """The `wanted` records measured on `device` (name, isa). The wanted ones of other
    devices are skipped with one warning counting them, or, when no wanted record is of
    this device, refused with an error naming the devices they are of."""
    wanted_ones = [r for r in records if wanted(r)]
    mine = [r for r in wanted_ones if measured_on(r, *device)]
    others = other_devices(wanted_ones, *device)
    if others and not mine:
        raise CompileError(f"{where} holds no record of {what} measured on this device "
                           f"({device[0]}); it holds {describe_devices(others)}: tune on "
                           f"this machine, or compile on the machine that measured them")
    if others:
        warnings.warn(f"{where}: skipped {sum(others.values())} record(s) of {what} measured "
                      f"on another device ({describe_devices(others)})", stacklevel=4)
    return mine


def _loaded(records: "str | Iterable[Record] | None") -> tuple[list[Record], str]:
    """The records, read once from a file or a record store, and where they came from (for
    messages)."""
    if records is None:
        return [], "no records"
    if isinstance(records, str):
        problem = missing_records(records)
        if problem:
            raise CompileError(problem)
        return load_records(records).records, describe_location(records)
    return list(records), "the records given"


def pytorch_part_seconds(target: str | Target, skipped: Sequence[Task],
                         part: Partition | None, inputs: Sequence[torch.Tensor],
                         threads: int) -> float | None:
    """Seconds of a network that run PyTorch however long it is tuned: the tasks without a
    kernel on the target (weight x PyTorch's time on random operands) and, for a captured
    network (`part`), its islands timed on the values `inputs` give them. Measured on this
    machine's CPU with `threads` threads for an llvm target; None for a cuda target, whose
    GPU is the measurers' and not this process's."""
    if parse_target(target).kind != "llvm":
        return None
    total = sum(t.weight * torch_seconds(t.compute, threads) for t in skipped)
    return total + (island_seconds(part, inputs, threads) if part is not None else 0.0)


def load(path: str, device=None):
    """The network saved at `path` (net.save, or `raytune-kernels compile -o`), ready to
    call: a CompiledNetwork or a GpuNetwork. Nothing is tuned, timed or solved, and neither
    Ray, XGBoost, PuLP nor the records are needed. A file of another format version, a
    truncated or altered file, a CPU without an instruction-set extension its kernels use,
    or a GPU of another arch is refused with an ArtifactError saying which. `device`: for a
    GPU network, the executor class (default: this machine's GPU through CuPy; one given,
    such as the tests' emulator, runs what it is handed, unchecked)."""
    header, state = open_state(path, check_machine=device is None)
    if header["machine"]["kind"] == "cuda":
        return GpuNetwork.from_state(state, device)
    return CompiledNetwork.from_state(state)
