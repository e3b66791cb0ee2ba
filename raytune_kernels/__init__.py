"""raytune-kernels: tune the kernels of a PyTorch network and compile it to beat PyTorch.

The four entry points are defined here: extract_tasks, tune_network, tune_tasks and
compile_network. tune_network and tune_tasks hand a TuneRequest to the Ray layer's driver
(actors/driver.py), which starts or joins Ray; compile_network asks it only for the layout
solver of a running Ray session. Names whose modules import PyTorch (the capture, the
compiled networks, records) are imported on first use (PEP 562), so the actors that
build, search and learn import only the modules they need.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Iterable, Sequence

from raytune_kernels.errors import (CaptureError, CompileError, DynamicShapeError, RaytuneError,
                                    TuneError, UnknownModelError, UnknownTargetError,
                                    UnsupportedOpError)
from raytune_kernels.target import Target, parse_target
from raytune_kernels.task import Compute, EpilogueOp, Task, TensorSpec
from raytune_kernels.tune.callbacks import Callback, CallbackError
from raytune_kernels.tune.request import TuneRequest
from raytune_kernels.version import __version__  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    import torch

    from raytune_kernels.compile.choose import Solver
    from raytune_kernels.compile.cpu_network import CompiledNetwork  # noqa: F401
    from raytune_kernels.compile.cuda_network import GpuNetwork  # noqa: F401
    from raytune_kernels.frontend.capture import capture  # noqa: F401
    from raytune_kernels.frontend.graph import Graph, Node  # noqa: F401
    from raytune_kernels.frontend.partition import Partition, execute, partition  # noqa: F401
    from raytune_kernels.tune.records import Record, load_records  # noqa: F401
    from raytune_kernels.tune.result import TuningResult  # noqa: F401

# name -> module that defines it, imported on first use
_LAZY = {
    "capture": "raytune_kernels.frontend.capture",
    "load": "raytune_kernels.compile.api",
    "ArtifactError": "raytune_kernels.compile.artifact",
    "Graph": "raytune_kernels.frontend.graph",
    "Node": "raytune_kernels.frontend.graph",
    "CompiledNetwork": "raytune_kernels.compile.cpu_network",
    "GpuNetwork": "raytune_kernels.compile.cuda_network",
    "Partition": "raytune_kernels.frontend.partition",
    "execute": "raytune_kernels.frontend.partition",
    "partition": "raytune_kernels.frontend.partition",
    "Record": "raytune_kernels.tune.records",
    "load_records": "raytune_kernels.tune.records",
    "TuningResult": "raytune_kernels.tune.result",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raytune_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def extract_tasks(model: "torch.nn.Module",
                  example_inputs: "Sequence[torch.Tensor] | torch.Tensor", *,
                  target: "str | Target" = "llvm", strict: bool = False) -> list[Task]:
    """Capture `model` and return its weighted tasks, in order of first appearance.

    Parameters
    ----------
    model, example_inputs
        The network and inputs of the shapes it will run on (a tensor or a sequence).
    target
        Validated, but does not change the tasks: their keys are target-independent.
    strict
        An op without a node of its own runs as a PyTorch island (one warning names each);
        strict=True refuses it instead (UnsupportedOpError naming the op and its layer).
    """
    from raytune_kernels.frontend.capture import capture
    from raytune_kernels.frontend.partition import partition

    parse_target(target)
    return list(partition(capture(model, example_inputs, strict=strict)).tasks)


def tune_network(model: "torch.nn.Module",
                 example_inputs: "Sequence[torch.Tensor] | torch.Tensor", *,
                 target: str = "llvm", trials: int = 200, records: str | None = None,
                 resume: bool = True, address: str | None = None,
                 num_measurers: int | None = None, num_builders: int | None = None,
                 search_actors: int | None = None, batch: int = 8, seed: int = 0,
                 threads: int = 1, verbose: bool = True, strict: bool = False,
                 callbacks: Sequence[Callback] = (),
                 seconds: float | None = None) -> "TuningResult":
    """Tune every task of `model` for `target` with a budget of `trials` measurements
    (and, with `seconds`, of time).

    Starts a local Ray when none is running, or joins `address`; everything that can fail
    (the target, the address, a GPU for cuda, the records, the cores) fails before any
    work, with a TuneError that says what. Ops without a kernel of ours run in PyTorch
    (islands, named in one warning) unless `strict`. Returns the best record per task and
    the estimated network latency (sum of weight x best latency; on "llvm" with the time
    of what runs PyTorch, measured once here with `threads` threads before tuning).

    Parameters
    ----------
    model, example_inputs
        The network and inputs of the shapes it will run on (a tensor or a sequence).
    target
        "llvm" (this CPU), "llvm -mcpu=NAME", "cuda" (every GPU of the cluster gets one
        measurer, the CPUs left build with NVRTC, for the measuring GPU's arch: records
        then carry "cuda -arch=sm_XY"), "cuda -arch=sm_XY", "cuda -precision=P".
    trials
        Measurements in all, shared by the tasks.
    seconds
        A time budget as well: no round starts this long after the first one began (Ray
        and the actors starting are not counted); the rounds then in flight are dropped,
        unrecorded. The run ends at whichever budget runs out first.
    records
        A JSON-lines file or a record store (directory, file://, s3://, gs://) that every
        measurement is written to; None keeps none.
    resume
        Count the measurements already in `records` toward the budget (never repeated),
        and start the cost model trained on them.
    address
        A Ray cluster to join ("auto", "host:port"); None starts or uses a local one.
    num_measurers, num_builders
        CPU measurer processes (each owns `threads` cores) and builder processes; None: one
        measurer, builders on the cores left. A cuda target measures on every GPU.
    search_actors
        Processes proposing candidates, the tasks dealt among them, each predicting with
        the shared cost model's latest booster. None: one on this machine; on a cluster,
        one per node (at most 8), placed on the nodes that offer the custom resource
        `raytune_search` (cluster.yaml) or else spread over every node.
    batch
        Candidates measured per round.
    seed
        Seeds the search, so a run is repeatable.
    threads
        Threads each CPU candidate runs with; records hold it, so compile at the same count.
    verbose
        Show the progress table (the first callback).
    strict
        Refuse ops without a kernel of ours instead of running them in PyTorch.
    callbacks
        raytune_kernels.Callback instances that hear of every round in this process, after
        its records are written.
    """
    from actors.driver import tune_model

    request = TuneRequest(target=target, trials=trials, records=records, resume=resume,
                          address=address, num_measurers=num_measurers,
                          num_builders=num_builders, search_actors=search_actors,
                          batch=batch, seed=seed, threads=threads, verbose=verbose,
                          seconds=seconds)
    return tune_model(request, model, example_inputs, strict=strict, callbacks=callbacks)


def tune_tasks(tasks: Sequence[Task], *, target: str = "llvm", trials: int = 200,
               records: str | None = None, resume: bool = True, address: str | None = None,
               num_measurers: int | None = None, num_builders: int | None = None,
               search_actors: int | None = None, batch: int = 8, seed: int = 0,
               threads: int = 1, verbose: bool = True,
               callbacks: Sequence[Callback] = (),
               seconds: float | None = None) -> "TuningResult":
    """tune_network() for a chosen list of tasks (e.g. some of extract_tasks(model, x)):
    the same checks, pipeline, records, callbacks and result, with `trials` shared by
    these tasks. On "llvm", the estimate's PyTorch part is that of the tasks without a
    kernel of ours (there is no network, so no islands).

    Parameters
    ----------
    tasks
        The tasks to tune.
    target, trials, records, resume, address, num_measurers, num_builders, search_actors,
    batch, seed
        As for tune_network.
    threads, verbose, callbacks, seconds
        As for tune_network.
    """
    from actors.driver import tune

    return tune(TuneRequest(target=target, tasks=tuple(tasks), trials=trials, records=records,
                            resume=resume, address=address, num_measurers=num_measurers,
                            num_builders=num_builders, search_actors=search_actors,
                            batch=batch, seed=seed, threads=threads, verbose=verbose,
                            seconds=seconds),
                 callbacks=callbacks)


def compile_network(model: "torch.nn.Module",
                    example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                    records: "str | Iterable[Record] | None" = None, *, target: str = "llvm",
                    fallback: str | None = None, threads: int = 1, layout: str = "ilp",
                    time_limit_s: float = 20.0, check: bool = True,
                    atol: float | None = None, verbose: bool = False,
                    solver: "Solver | None" = None, graph: bool = True, refine: int = 8,
                    rewrites: bool = True) -> "CompiledNetwork | GpuNetwork":
    """Compile `model` from the best kernels in `records` for `target`.

    On "llvm": a CompiledNetwork (native calls over one buffer pool) from the records
    measured on this CPU at `threads` threads. A task without records (or every task, with
    records=None) runs the analytic estimate's best config, untuned, named in a warning;
    with fallback="torch" it runs PyTorch's kernel instead, and so does any step whose best
    kernel is slower than PyTorch's measured time for it. A task no kernel of ours fits,
    and an op the capture kept as a PyTorch island, run PyTorch's either way.

    On "cuda": a GpuNetwork (cubins over one device arena, replayed as one CUDA graph) from
    the records of its arch and precision; a task without one runs an untuned default
    config chosen by rule, named in a warning, or PyTorch's kernel with fallback="torch".

    Parameters
    ----------
    model, example_inputs
        The network and inputs of the shapes it will run on (a tensor or a sequence).
    records
        A records file or store, or the records themselves; None compiles untuned. Only
        the target's records are taken: on "llvm" those measured on this CPU at `threads`
        threads, on "cuda" those of its arch and precision.
    target
        "llvm", "llvm -mcpu=NAME", "cuda", "cuda -arch=sm_XY", "cuda -precision=P" (tf32,
        fp16, bf16; fp32 by default), "llvm -precision=bf16" (convolutions, denses and
        matmuls on AMX tiles, on a CPU that has them).
    fallback
        "torch": a task without records, and any step PyTorch runs faster, runs PyTorch's
        kernel; None: our untuned config.
    threads
        Threads the network runs with on "llvm" (an option of the CPU only).
    layout
        "ilp" picks every step's layouts with the layout ILP; "uniform" keeps one layout
        family for the whole network (the baseline the ILP must beat).
    time_limit_s
        The layout solver's limit.
    check, atol
        Compare the output with model(x): the largest difference over the output's scale
        (its largest magnitude) must be <= atol, so large activations are not refused for
        float rounding, nor small ones passed by a bound larger than themselves. By default
        the network tolerance of the target's precision (raytune_kernels/precision.py:
        1e-3 in fp32); on "llvm" in bf16, twice the error PyTorch's own bf16 run of the
        model makes where that is larger (deep networks lose more to rounding).
    verbose
        Print the plan's summary.
    solver
        Solves the layout problem; None: the LayoutActor's on a running Ray session, else
        PuLP/CBC in this process (Ray is never started for it).
    graph
        On "cuda", replay the network as one CUDA graph (False: launch step by step).
    refine
        On "llvm", from records: weigh up to `refine` of each step's best records that read
        and write the plan's layouts by clocking them inside the running network, and keep
        the fastest as it runs (compile/refine.py), remembered on this machine for the next
        compile of the same plan; then, at 2 threads or more, give the steps whose threads
        split channels their best record that splits rows, where the network runs faster
        so (the split agreement). 0 or 1 keeps each layout pair's best record as timed
        alone.
    rewrites
        On "cuda", plan sibling denses (one input, one task: a layer's query, key and value
        projections) as one kernel, let matmuls read and write attention's permutes in
        place, and round tf32 weights once at packing; False plans every step as its own
        launch or copy (the baseline they must beat, and for debugging).
    """
    from actors.driver import layout_solver
    from raytune_kernels.compile.api import compile_network as compile_here

    return compile_here(model, example_inputs, records, target=target, fallback=fallback,
                        threads=threads, layout=layout, time_limit_s=time_limit_s,
                        check=check, atol=atol, verbose=verbose,
                        solver=solver or layout_solver(), graph=graph, refine=refine,
                        rewrites=rewrites)


__all__ = [
    "ArtifactError", "Callback", "CallbackError", "CaptureError", "CompileError",
    "CompiledNetwork",
    "Compute", "DynamicShapeError", "EpilogueOp", "GpuNetwork", "Graph", "Node", "Partition",
    "RaytuneError", "Record", "Target", "Task", "TensorSpec", "TuneError", "TuneRequest",
    "TuningResult", "UnknownModelError", "UnknownTargetError", "UnsupportedOpError",
    "capture", "compile_network", "execute", "extract_tasks", "load", "load_records",
    "parse_target",
    "partition", "tune_network", "tune_tasks",
]
