"""tune_network(): the driver entry point. The one core module that starts Ray and the
actors; it imports them only when called, so the core stays importable without Ray."""
from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Sequence

import torch

from raytune_kernels.compile.api import compile_network as compile_here
from raytune_kernels.cpu.machine import cpu_info, host_device
from raytune_kernels.backend import unsupported_on
from raytune_kernels.errors import RaytuneError
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.tune.callbacks import Callback, notify, stopped
from raytune_kernels.tune.records import (RecordWriter, describe_devices, load_records,
                                          measured_on)
from raytune_kernels.tune.storage import StorageError, is_store, is_uri, open_store
from raytune_kernels.space import Config, describe_tuned_before, tuned_before_knobs
from raytune_kernels.target import Target, parse_target
from raytune_kernels.task import Task
from raytune_kernels.tune.tuner import TuneOptions, TuningResult


class TuneError(RaytuneError):
    """Tuning could not start (bad address, unwritable records, unsupported target)."""


def compile_network(*args, **kwargs):
    """compile.api.compile_network; on a running Ray session (this process called
    ray.init, or tune_network started one) its layout problems are solved in the
    LayoutActor, without one in this process. Ray is never started for it."""
    if kwargs.get("solver", 0) is None:
        del kwargs["solver"]
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and "solver" not in kwargs:
        from actors.layout_actor import solve_on_ray

        kwargs["solver"] = solve_on_ray
    return compile_here(*args, **kwargs)


compile_network.__doc__ += "\n\n" + (compile_here.__doc__ or "")


def tune_network(model: torch.nn.Module, example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                 target: str = "llvm", trials: int = 200, records: str | None = None,
                 resume: bool = True, address: str | None = None,
                 num_measurers: int | None = None, num_builders: int | None = None,
                 batch: int = 8, seed: int = 0, threads: int = 1, verbose: bool = True,
                 strict: bool = False, callbacks: Sequence[Callback] = ()) -> TuningResult:
    """Tune every task of `model` for `target` with a budget of `trials` measurements.

    On "llvm", each candidate runs with `threads` threads on a measurer that owns that
    many cores. On "cuda", every GPU of the cluster gets one measurer and the CPUs left
    build with NVRTC, for the target's -arch or else the measuring GPU's own (records then
    carry "cuda -arch=sm_XY"); a cluster without a GPU fails before any work.
    Starts a local Ray when none is running, or joins `address`. With `resume`, the
    measurements already in `records` count toward the budget and are never repeated,
    and the cost model starts trained on them. Returns the best record per task and the
    estimated network latency (sum of weight x best latency). Ops without a kernel of ours
    run in PyTorch (islands, named in one warning) unless `strict`, which refuses them; on
    "llvm" the estimate includes their PyTorch time (and that of tasks with no kernel on
    this CPU), measured once on this machine with `threads` threads before tuning.
    `callbacks` (raytune_kernels.Callback) hear of every round in this process, after its
    records are written; `verbose` adds the progress table as the first of them."""
    from raytune_kernels import capture, partition

    _check_numbers(trials=trials, batch=batch, threads=threads, num_measurers=num_measurers,
                   num_builders=num_builders)
    callbacks = _check_callbacks(callbacks)
    records = canonical_records_path(records)
    tgt = _preflight(target, records, address, threads, num_measurers)
    part = partition(capture(model, example_inputs, strict=strict))
    inputs = ((example_inputs,) if isinstance(example_inputs, torch.Tensor)
              else tuple(example_inputs))
    return _tune(list(part.tasks), tgt, trials, records, resume, address, num_measurers,
                 num_builders, batch, seed, threads, verbose, callbacks, network=(part, inputs))


def tune_tasks(tasks: Sequence[Task], target: str = "llvm", trials: int = 200,
               records: str | None = None, resume: bool = True, address: str | None = None,
               num_measurers: int | None = None, num_builders: int | None = None,
               batch: int = 8, seed: int = 0, threads: int = 1, verbose: bool = True,
               callbacks: Sequence[Callback] = ()) -> TuningResult:
    """tune_network() for a chosen list of tasks (e.g. some of extract_tasks(model, x)):
    the same checks, pipeline, records, callbacks and result, with `trials` shared by
    these tasks."""
    _check_numbers(trials=trials, batch=batch, threads=threads, num_measurers=num_measurers,
                   num_builders=num_builders)
    callbacks = _check_callbacks(callbacks)
    records = canonical_records_path(records)
    tgt = _preflight(target, records, address, threads, num_measurers)
    return _tune(list(tasks), tgt, trials, records, resume, address, num_measurers,
                 num_builders, batch, seed, threads, verbose, callbacks)


def canonical_records_path(records) -> str | None:
    """The records location, resolved once here: the driver reads the history from it and
    the scheduler actor, in another process with its own working directory, writes to it.
    A relative path resolved in each (a job submitted with a working_dir, a driver started
    elsewhere) read one file and wrote another. A local path becomes absolute (a directory,
    a record store, keeps its trailing separator, so it stays one before it exists); a URI
    names the same place from anywhere and is kept, once its scheme is known usable."""
    if records is None or records == "":
        return None
    if not isinstance(records, (str, os.PathLike)):
        raise TuneError(f"records must be a path or a URI, got {type(records).__name__}")
    location = os.path.expanduser(os.fspath(records))
    if is_uri(location):
        try:
            open_store(location)  # pyarrow there, and the scheme one it can open
        except StorageError as exc:
            raise TuneError(str(exc)) from None
        return location
    path = os.path.abspath(location)
    return path + os.sep if is_store(location) else path


def _check_numbers(**numbers) -> None:
    """Every count a run takes is a positive integer (None: the default), refused before
    any work with an error naming the argument."""
    for name, value in numbers.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TuneError(f"{name} must be a positive integer, got {value!r}")


def _check_callbacks(callbacks) -> list[Callback]:
    """A list of Callback instances, refused before any work: a function or a lone
    callback passed instead would fail only once the first round was measured."""
    if not isinstance(callbacks, (list, tuple)) or \
            not all(isinstance(c, Callback) for c in callbacks):
        raise TuneError(f"callbacks must be a list of raytune_kernels.Callback instances "
                        f"(subclass it, override on_round, on_records, ...), got {callbacks!r}")
    return list(callbacks)


def _preflight(target: str, records: str | None, address: str | None, threads: int,
               num_measurers: int | None) -> Target:
    """Everything that can fail before any work: the target, the cluster address, a GPU
    for cuda, a writable records file, the cores for CPU measurers."""
    tgt = parse_target(target)
    if tgt.kind == "llvm" and tgt.mcpu:
        from raytune_kernels.cpu.probe import unusable_mcpu

        problem = unusable_mcpu(tgt.mcpu)
        if problem:
            raise TuneError(f"target {str(tgt)!r}: {problem}")
    if address:
        check_reachable(address)
    if tgt.kind == "cuda":
        _check_cuda(tgt, address, threads, num_measurers)
    if records:
        RecordWriter(records).close()  # an unwritable path fails here, before any work
    if not address and tgt.kind == "llvm":
        _check_cores(threads, num_measurers)
    return tgt


def _tune(tasks: list[Task], tgt: Target, trials, records, resume, address, num_measurers,
          num_builders, batch, seed, threads, verbose, callbacks, network=None
          ) -> TuningResult:
    tasks, skipped = _tunable(tasks, tgt)
    if trials < len(tasks):
        warnings.warn(f"{trials} trials for {len(tasks)} tasks: {len(tasks) - trials} task(s) "
                      f"get no trial and no kernel, and the estimate stays infinite; give at "
                      f"least {len(tasks)} trials (each task's first round is shortened to fit)",
                      stacklevel=3)
    torch_s = _torch_part(skipped, network, tgt, threads)
    history = load_records(records).records if (records and resume) else []
    ray = _start_ray(address)
    return _run(ray, tasks, tgt, records, history, trials, batch, seed,
                threads, num_measurers, num_builders, verbose, callbacks, torch_s)


def _torch_part(skipped: list[Task], network, tgt: Target, threads: int) -> float:
    """Seconds of the network that run PyTorch however long we tune: tasks without a kernel
    here (weight x PyTorch's time on random operands) and, for a captured network
    (`network` = (partition, inputs)), its islands timed on the values they receive.
    Measured on this machine's CPU with `threads` threads; on cuda they are not measured
    (the GPU is the measurers'), and the estimate says it leaves them out."""
    part = network[0] if network else None
    islands = part is not None and any(n.op == "torch" for n in part.graph.nodes)
    if tgt.kind != "llvm":
        if skipped or islands:
            warnings.warn("the estimated latency leaves out what runs PyTorch (islands, tasks "
                          f"without a kernel): it is measured only for llvm, not {tgt.kind}",
                          stacklevel=4)
        return 0.0
    from raytune_kernels.compile.cpu_network import island_seconds, torch_seconds

    total = sum(t.weight * torch_seconds(t.compute, threads) for t in skipped)
    return total + (island_seconds(part, network[1], threads) if islands else 0.0)


def _check_cores(threads: int, num_measurers: int | None) -> None:
    """CPU measurers own `threads` cores each: this machine must have them all."""
    if threads < 1 or (num_measurers or 1) * threads > len(os.sched_getaffinity(0)):
        raise TuneError(f"{num_measurers or 1} measurer(s) x {threads} thread(s) need more "
                        f"cores than this machine gives us ({len(os.sched_getaffinity(0))})")


def _check_cuda(tgt: Target, address: str | None, threads: int,
                num_measurers: int | None) -> None:
    """What a cuda target needs, checked before any work (and before a records file is
    created): options that mean something on a GPU, a GPU in the cluster, NVRTC here."""
    if threads != 1 or num_measurers is not None:
        raise TuneError(f"target {str(tgt)!r}: threads and num_measurers are CPU options; "
                        "a cuda target measures on every GPU of the cluster, one "
                        "candidate at a time each")
    require_gpu(_start_ray(address), str(tgt))
    if not address:  # on a cluster the builders' nodes compile, not this one
        from raytune_kernels.cuda.build import nvrtc_unavailable

        reason = nvrtc_unavailable()
        if reason:
            raise TuneError(f"target {str(tgt)!r} compiles with NVRTC, which is not "
                            f"usable here: {reason}")


def require_gpu(ray, target: str) -> None:
    """A cuda target measures on GPUs: fail when the Ray cluster has none."""
    gpus = ray.cluster_resources().get("GPU", 0)
    if gpus < 1:
        raise TuneError(f"target {target!r} needs a GPU to measure on, and the Ray cluster "
                        f"has none (its resources list {gpus:g} GPU); tune for 'llvm' "
                        "here, or join a cluster with GPU nodes (address=...)")


def _initial(ray, actor):
    """The scheduler actor's first table; a problem it found while setting up (a GPU the
    cubins cannot load on) is raised here as itself, not as Ray's wrapper."""
    from ray.exceptions import RayTaskError

    try:
        return ray.get(actor.initial.remote())
    except RayTaskError as exc:
        if isinstance(exc.cause, RaytuneError):
            raise exc.cause from None
        raise


def _tunable(tasks, tgt: Target) -> tuple[list[Task], list[Task]]:
    """(the tasks the target has a kernel for, the others), warning once about those."""
    reasons = [unsupported_on(tgt)(t.compute) for t in tasks]
    skipped = [(t, r) for t, r in zip(tasks, reasons) if r]
    if skipped:
        warnings.warn(f"not tuned for {tgt.kind} (no kernel for them yet): " +
                      "; ".join(f"{t.compute.describe()} ({r})" for t, r in skipped),
                      stacklevel=4)
    return [t for t, r in zip(tasks, reasons) if not r], [t for t, _ in skipped]


def check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast on a host:port nobody answers on (Ray itself retries for minutes)."""
    import socket

    target = address.split("://", 1)[-1]
    if target == "auto" or ":" not in target:
        return
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as exc:
        raise TuneError(f"cannot reach a Ray cluster at {address!r}: {exc}") from None


def _start_ray(address: str | None):
    import ray

    if ray.is_initialized():
        return ray
    try:
        if address:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise TuneError(f"cannot join the Ray cluster at {address!r}: {exc}") from None
    return ray


def _run(ray, tasks, tgt: Target, records, history, trials, batch, seed, threads,
         num_measurers, num_builders, verbose, callbacks, torch_s: float = 0.0
         ) -> TuningResult:
    from actors.tuning_actors import ON_HEAD, TaskSchedulerActor

    from raytune_kernels.tune.progress import ProgressView

    opts = TuneOptions(trials=trials, batch=batch, seed=seed, threads=threads)
    # on a GPU, "cold" is an L2 flushed before every repeat (cuda/measure.py)
    mopts = MeasureOptions(threads=threads, min_repeat_ms=10, repeats=3, timeout_s=30,
                           cold_weights=opts.cold_weights, flush_cache=tgt.kind == "cuda")
    cluster = len([n for n in ray.nodes() if n["Alive"]]) > 1
    cpu = cpu_info(tgt.mcpu) if tgt.kind == "llvm" else None  # a GPU describes itself
    # records name the CPU that measures them (with -mcpu=X, code for X timed on this host)
    host, isa = host_device() if cpu else (None, None)
    if cpu is not None and history:
        _warn_tuned_before(tasks, history, str(tgt), host, isa, threads, cpu)
    actor = TaskSchedulerActor.options(**ON_HEAD).remote(
        [t.to_json() for t in tasks], str(tgt), host, cpu, records,
        [r.to_json() for r in history], opts, num_measurers, num_builders, mopts, tgt.mcpu,
        cluster, isa, torch_s)
    view = ProgressView(trials) if verbose else None
    callbacks = ([view] if view else []) + callbacks
    try:
        result = _rounds(ray, actor, tgt, records, callbacks, torch_s)
    except BaseException as exc:
        if view:
            view.__exit__(None, None, None)  # a live table gives the terminal back
        stopped_by = host_fault_error(exc)
        if stopped_by is not None:
            raise stopped_by from None
        raise
    finally:
        ray.kill(actor)
    notify(callbacks, "on_end", result, stopped(len(result.rounds), result.trials, records))
    return result


def _warn_tuned_before(tasks, history, target: str, host: str, isa, threads: int, cpu
                       ) -> None:
    """One warning when resumed tasks hold only records measured before a knob joined
    their space (space.tuned_before_knobs): the search reaches what that knob adds only
    with the trials this run adds beyond the records already there, and a `trials` no
    larger than those adds none."""
    from raytune_kernels.cpu.schedules import space_for

    keys = {t.key for t in tasks}
    mine = [r for r in history if r.ok and r.task_key in keys and r.target == target
            and r.threads == threads and measured_on(r, host, isa)]
    spaces = {t.key: space_for(t.compute, cpu) for t in tasks}
    older = describe_tuned_before(tasks, tuned_before_knobs(
        ((r.task_key, Config.from_json(r.config)) for r in mine), spaces))
    if older:
        warnings.warn(f"{older}: only the trials this run adds beyond the {len(mine)} "
                      f"records resumed search it", stacklevel=5)


def host_fault_error(exc: BaseException) -> TuneError | None:
    """The run's error when the scheduler actor stopped it for the machine's sake (a full
    temp dir: actors.pipeline.HostFault, wrapped by Ray), else None."""
    from actors.pipeline import HostFault

    cause = getattr(exc, "cause", None)
    return TuneError(f"tuning stopped: {cause}") if isinstance(cause, HostFault) else None


def _rounds(ray, actor, tgt: Target, records, callbacks, torch_s: float) -> TuningResult:
    """Every round of the scheduler actor, each told to the callbacks once its records are
    written; the result, with the PyTorch part added to its estimates."""
    first = _initial(ray, actor)
    others = ray.get(actor.other_devices.remote())
    if others:
        warnings.warn(f"{records}: skipped {sum(others.values())} record(s) of target "
                      f"{str(tgt)!r} measured on another device "
                      f"({describe_devices(others)}); this run tunes its own", stacklevel=5)
    notify(callbacks, "on_start", _with_torch(first, torch_s), stopped(0, first.trials, records))
    while (step := ray.get(actor.step.remote())) is not None:
        summary, new = _with_torch(step[0], torch_s), step[1]
        where = stopped(summary.round, summary.trials, records)
        notify(callbacks, "on_records", new, where)
        notify(callbacks, "on_round", summary, where)
    result = ray.get(actor.result.remote())
    result.estimated_latency_s += torch_s
    result.torch_s = torch_s
    result.rounds = [dataclasses.replace(p, estimated_s=p.estimated_s + torch_s)
                     for p in result.rounds]
    return result


def _with_torch(summary, torch_s: float):
    """A round's summary with the PyTorch part added to its estimate."""
    return dataclasses.replace(summary, estimated_s=summary.estimated_s + torch_s,
                               torch_s=torch_s)

