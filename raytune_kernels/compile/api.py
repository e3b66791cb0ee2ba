"""compile_network(), the public entry point: one call for every target, handed to the
target's network compiler (cpu_network for llvm, cuda_network for cuda)."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from raytune_kernels.compile.choose import Solver
from raytune_kernels.compile.cpu_network import compile_network_cpu
from raytune_kernels.compile.cuda_network import compile_network_cuda
from raytune_kernels.errors import CompileError
from raytune_kernels.layout.problem import solve_ilp
from raytune_kernels.target import parse_target
from raytune_kernels.tune.records import Record


def compile_network(model: torch.nn.Module,
                    example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                    records: "str | Iterable[Record] | None" = None, target: str = "llvm",
                    fallback: str | None = None, threads: int = 1, layout: str = "ilp",
                    time_limit_s: float = 20.0, check: bool = True,
                    atol: float | None = None, verbose: bool = False,
                    solver: Solver = solve_ilp, graph: bool = True):
    """Compile `model` from the best kernels in `records` for `target`.

    On "llvm" targets: a cpu_network.CompiledNetwork from the records measured at
    `threads` threads. layout="ilp" picks every step's layouts with the ILP; "uniform"
    keeps one layout family for the whole network (the best of them), the baseline the
    ILP must beat. A task without records (or every task, with records=None) runs the
    analytic estimate's best config, untuned, named in a warning; with fallback="torch"
    it runs PyTorch's kernel instead, and so does any step whose best kernel is slower
    than PyTorch's measured time for it. A task no kernel of ours fits, and an op the
    capture kept as a PyTorch island, run PyTorch's either way. With `check`, the output
    is compared with model(x): the largest difference over the output's scale (its
    largest magnitude) must be <= atol, so large activations are not refused for float
    rounding, nor small ones passed by a bound larger than themselves.

    On "cuda" targets: a cuda_network.GpuNetwork (the same calls, run on the GPU, from
    records of its arch; a task without one runs an untuned default config chosen by
    rule, named in a warning, or PyTorch's kernel with fallback="torch"; `threads` is an
    option of the CPU path only). The target's precision ("cuda -precision=tf32", fp16,
    bf16; fp32 by default) picks the records of that precision and the check's default
    tolerance (raytune_kernels/precision.py; 1e-3 of the output's scale in fp32, and on
    the CPU). Each call replays the network as one CUDA graph, unless graph=False.

    `solver` solves the layout problem: PuLP/CBC in this process by default. Called as
    raytune_kernels.compile_network on a running Ray session, it is the LayoutActor's
    (actors/layout_actor.py)."""
    tgt = parse_target(target)
    if tgt.kind == "cuda":
        return compile_network_cuda(model, example_inputs, records, tgt, fallback=fallback,
                                    check=check, atol=atol, verbose=verbose, layout=layout,
                                    time_limit_s=time_limit_s, solver=solver, graph=graph)
    if tgt.kind != "llvm":
        raise CompileError(f"target {target!r}: no network compiler for this target kind")
    return compile_network_cpu(model, example_inputs, records, tgt, fallback=fallback,
                               threads=threads, layout=layout, time_limit_s=time_limit_s,
                               check=check, atol=1e-3 if atol is None else atol,
                               verbose=verbose, solver=solver)
