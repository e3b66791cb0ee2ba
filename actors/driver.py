"""The driver of a tuning run: raytune_kernels.tune_network / tune_tasks (and the CLI's
`tune`) hand it a TuneRequest; it checks what can fail before any work, starts or joins
Ray, starts the task scheduler actor and tells the callbacks of every round. Also the
layout solver of a compile on a running Ray session. It imports the core modules it uses
directly, and Ray only when called."""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import warnings
from typing import Sequence

import torch

from raytune_kernels.backend import backend_for, platform_for, unsupported_on
from raytune_kernels.compile.api import pytorch_part_seconds
from raytune_kernels.compile.choose import Solver
from raytune_kernels.errors import RaytuneError, TuneError
from raytune_kernels.frontend.capture import capture
from raytune_kernels.frontend.partition import Partition, partition
from raytune_kernels.layout.problem import solve_ilp
from raytune_kernels.space import Config, describe_tuned_before, tuned_before_knobs
from raytune_kernels.target import Target, parse_target
from raytune_kernels.task import Task
from raytune_kernels.tune.callbacks import Callback, notify, stopped
from raytune_kernels.tune.records import (Record, RecordWriter, describe_devices, load_records,
                                          measured_on)
from raytune_kernels.tune.request import TuneRequest
from raytune_kernels.tune.storage import StorageError, is_store, is_uri, open_store
from raytune_kernels.tune.tuner import TuningResult

__all__ = ["TuneError", "canonical_records_path", "layout_solver", "tune", "tune_model"]


def layout_solver() -> Solver:
    """The LayoutActor's solver on a running Ray session (this process called ray.init, or
    tune_network started one), else PuLP/CBC in this process. Ray is never started, nor
    imported, for it."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        from actors.layout_actor import solve_on_ray

        return solve_on_ray
    return solve_ilp


def tune_model(request: TuneRequest, model: torch.nn.Module,
               example_inputs: "Sequence[torch.Tensor] | torch.Tensor", *,
               strict: bool = False, callbacks: Sequence[Callback] = ()) -> TuningResult:
    """raytune_kernels.tune_network's run: the checks, then `model` captured (`strict`:
    refusing ops without a kernel) and its tasks tuned as `request` says."""
    callbacks = _check_callbacks(callbacks)
    request = _preflight(request)
    part = partition(capture(model, example_inputs, strict=strict))
    inputs = ((example_inputs,) if isinstance(example_inputs, torch.Tensor)
              else tuple(example_inputs))
    return _tune(dataclasses.replace(request, tasks=tuple(part.tasks)), callbacks, part, inputs)


def tune(request: TuneRequest, *, callbacks: Sequence[Callback] = ()) -> TuningResult:
    """raytune_kernels.tune_tasks's run: the checks, then `request.tasks` tuned."""
    callbacks = _check_callbacks(callbacks)
    return _tune(_preflight(request), callbacks)


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


def _check_callbacks(callbacks) -> list[Callback]:
    """A list of Callback instances, refused before any work: a function or a lone
    callback passed instead would fail only once the first round was measured."""
    if not isinstance(callbacks, (list, tuple)) or \
            not all(isinstance(c, Callback) for c in callbacks):
        raise TuneError(f"callbacks must be a list of raytune_kernels.Callback instances "
                        f"(subclass it, override on_round, on_records, ...), got {callbacks!r}")
    return list(callbacks)


def _preflight(request: TuneRequest) -> TuneRequest:
    """Everything that can fail before any work: the records location, the target and its
    options, the cluster address, a GPU in the cluster where the target measures on one,
    what this machine needs to build and measure alone, a writable records file. Returns
    the request with its target and records location in canonical form."""
    records = canonical_records_path(request.records)
    tgt = parse_target(request.target)
    platform = platform_for(tgt)
    problem = platform.refuses(tgt, request.threads, request.num_measurers)
    if problem:
        raise TuneError(f"target {str(tgt)!r}: {problem}")
    if request.address:
        check_reachable(request.address)
    if platform.on_gpu:
        require_gpu(_start_ray(request.address), str(tgt))
    # on a cluster the other nodes build and measure, not this one
    problem = None if request.address else \
        platform.lacks_here(tgt, request.threads, request.num_measurers)
    if problem:
        raise TuneError(f"target {str(tgt)!r}: {problem}")
    if records:
        RecordWriter(records).close()  # an unwritable path fails here, before any work
    return dataclasses.replace(request, target=str(tgt), records=records)


def _tune(request: TuneRequest, callbacks: list[Callback], part: Partition | None = None,
          inputs: Sequence[torch.Tensor] = ()) -> TuningResult:
    """The checked request's run: its tunable tasks, the PyTorch part of the estimate, the
    history resumed, Ray, and the measuring CPU, then the rounds."""
    tasks, skipped = _tunable(list(request.tasks), request.target)
    if request.trials < len(tasks):
        warnings.warn(f"{request.trials} trials for {len(tasks)} tasks: "
                      f"{len(tasks) - request.trials} task(s) get no trial and no kernel, and "
                      f"the estimate stays infinite; give at least {len(tasks)} trials (each "
                      f"task's first round is shortened to fit)", stacklevel=4)
    torch_s = _torch_part(request, skipped, part, inputs)
    history = load_records(request.records).records if (request.records and
                                                         request.resume) else []
    ray = _start_ray(request.address)
    measuring = platform_for(request.target).measuring_cpu(parse_target(request.target))
    cpu, device, isa = measuring or (None, None, None)
    request = dataclasses.replace(
        request, tasks=tuple(tasks), torch_s=torch_s, cpu=cpu, device=device, isa=isa,
        cluster=len([n for n in ray.nodes() if n["Alive"]]) > 1)
    done = _recorded_already(ray, request, history) if history else None
    if done is not None:
        return _without_trials(done, request, callbacks)
    return _run(ray, request, history, callbacks)


class _NoSearch:
    """The search pool of a run with no trial left to spend: it hears the records resumed
    and never proposes."""

    def observe(self, key: str, cfgs: list[Config], seconds: list[float]) -> None:
        pass

    def learn(self, records: list[Record]) -> None:
        pass

    def exhausted(self, key: str) -> bool:
        return False

    def unseeded(self, key: str, measured: list[Config]) -> bool:
        return False

    def propose(self, key: str, n: int) -> list[Config]:
        raise AssertionError("a run whose budget the records hold proposes nothing")


def _recorded_already(ray, request: TuneRequest, history: list[Record]):
    """A Tuner over the records resumed when they already hold the whole budget for these
    tasks, this target and the device that would measure; else None. Such a run measures
    nothing, so it starts no actor: neither measurers, builders nor search actors, whose
    start is most of a resumed run's time. A cuda target's arch and GPU name come from
    one short task on a GPU of the cluster."""
    from raytune_kernels.tune.tuner import Tuner

    keys = {t.key for t in request.tasks}
    if sum(r.task_key in keys for r in history) < request.trials:
        return None  # too few on any target or device: no need to ask a GPU which it is
    target, device = request.target, request.device
    if platform_for(target).on_gpu:
        ref = _gpu_identity(ray).remote()
        try:
            arch, device = ray.get(ref, timeout=GPU_IDENTITY_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            # every GPU is busy: tune as usual, whose measurers wait for one and say so
            ray.cancel(ref, force=True)
            return None
        target = str(dataclasses.replace(parse_target(target), arch=arch))
    tuner = Tuner(list(request.tasks), target, device, _never_measured, _NoSearch(),
                  history=history, opts=request.tune_options(), isa=request.isa)
    return tuner if tuner.spent >= request.trials else None


def _never_measured(batch):
    raise AssertionError("a run whose budget the records hold measures nothing")


GPU_IDENTITY_TIMEOUT_S = 60.0  # for a GPU to name itself, before tuning goes on as usual


def _gpu_identity(ray):
    """A Ray task that returns (arch, product name) of the GPU it is given."""
    @ray.remote(num_gpus=1, num_cpus=0, max_retries=0)
    def identity() -> tuple[str, str]:
        from raytune_kernels.cuda.device import device_arch, device_name

        return device_arch(), device_name()
    return identity


def _without_trials(tuner, request: TuneRequest, callbacks: list[Callback]) -> TuningResult:
    """The run of `_recorded_already`'s tuner, told to the callbacks as `_run` tells one:
    its table, no round, its result (the best records resumed, with the PyTorch part)."""
    from raytune_kernels.tune.progress import ProgressView

    records, torch_s = request.records, request.torch_s
    callbacks = ([ProgressView(request.trials)] if request.verbose else []) + callbacks
    first = tuner.initial()
    notify(callbacks, "on_start", _with_torch(first, torch_s), stopped(0, first.trials, records))
    result = tuner.result()
    result.records = records  # the tuner writes none: it has nothing to write
    result.setup = {"measurers": 0, "nodes": 0, "streamed": False, "search_nodes": [],
                    "search_restarts": 0}
    result.estimated_latency_s += torch_s
    result.torch_s = torch_s
    notify(callbacks, "on_end", result, stopped(0, result.trials, records))
    return result


def _torch_part(request: TuneRequest, skipped: list[Task], part: Partition | None,
                inputs: Sequence[torch.Tensor]) -> float:
    """Seconds of the network that run PyTorch however long we tune
    (compile.api.pytorch_part_seconds); where the target's are not measured here, 0, and
    the estimate says it leaves them out."""
    seconds = pytorch_part_seconds(request.target, skipped, part, inputs, request.threads)
    if seconds is not None:
        return seconds
    islands = part is not None and any(n.op == "torch" for n in part.graph.nodes)
    if skipped or islands:
        warnings.warn("the estimated latency leaves out what runs PyTorch (islands, tasks "
                      f"without a kernel): it is not measured for target {request.target!r}",
                      stacklevel=5)
    return 0.0


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


def _tunable(tasks: list[Task], target: str | Target) -> tuple[list[Task], list[Task]]:
    """(the tasks the target has a kernel for, the others), warning once about those."""
    tgt = parse_target(target)
    reasons = [unsupported_on(tgt)(t.compute) for t in tasks]
    skipped = [(t, r) for t, r in zip(tasks, reasons) if r]
    if skipped:
        warnings.warn(f"not tuned for {tgt.kind} (no kernel for them yet): " +
                      "; ".join(f"{t.compute.describe()} ({r})" for t, r in skipped),
                      stacklevel=5)
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


def _run(ray, request: TuneRequest, history: list[Record], callbacks: list[Callback]
         ) -> TuningResult:
    from actors.tuning_actors import ON_HEAD, TaskSchedulerActor

    from raytune_kernels.tune.progress import ProgressView

    if request.cpu is not None and history:
        _warn_tuned_before(request, history)
    actor = TaskSchedulerActor.options(**ON_HEAD).remote(request, [r.to_json() for r in history])
    view = ProgressView(request.trials) if request.verbose else None
    callbacks = ([view] if view else []) + callbacks
    try:
        result = _rounds(ray, actor, request, callbacks)
    except BaseException as exc:
        if view:
            view.__exit__(None, None, None)  # a live table gives the terminal back
        stopped_by = host_fault_error(exc)
        if stopped_by is not None:
            raise stopped_by from None
        raise
    finally:
        _flush(ray, actor)
        ray.kill(actor)
    notify(callbacks, "on_end", result, stopped(len(result.rounds), result.trials,
                                                request.records))
    return result


def _flush(ray, actor) -> None:
    """The scheduler actor's records and metrics made durable before it is killed (its
    writer batches them: tune/records.RecordWriter); an actor already dead has none."""
    try:
        ray.get(actor.flush.remote(), timeout=5)
    except Exception:  # dead, or stuck in a round: what it wrote to the OS stays
        pass


def _warn_tuned_before(request: TuneRequest, history: list[Record]) -> None:
    """One warning when resumed tasks hold only records measured before a knob joined
    their space (space.tuned_before_knobs): the search reaches what that knob adds only
    with the trials this run adds beyond the records already there, and a `trials` no
    larger than those adds none."""
    keys = {t.key for t in request.tasks}
    mine = [r for r in history if r.ok and r.task_key in keys and r.target == request.target
            and r.threads == request.threads and measured_on(r, request.device, request.isa)]
    space = backend_for(request.target, request.cpu).space
    spaces = {t.key: space(t.compute) for t in request.tasks}
    older = describe_tuned_before(request.tasks, tuned_before_knobs(
        ((r.task_key, Config.from_json(r.config)) for r in mine), spaces))
    if older:
        warnings.warn(f"{older}: only the trials this run adds beyond the {len(mine)} "
                      f"records resumed search it", stacklevel=6)


def host_fault_error(exc: BaseException) -> TuneError | None:
    """The run's error when the scheduler actor stopped it for the machine's sake (a full
    temp dir: actors.pipeline.HostFault, wrapped by Ray), else None."""
    from actors.pipeline import HostFault

    cause = getattr(exc, "cause", None)
    return TuneError(f"tuning stopped: {cause}") if isinstance(cause, HostFault) else None


def _rounds(ray, actor, request: TuneRequest, callbacks: list[Callback]) -> TuningResult:
    """Every round of the scheduler actor, each told to the callbacks once its records are
    written, until the trials are spent or, with request.seconds, that long after the
    first began (what is in flight then is dropped unrecorded); the result, with the
    PyTorch part added to its estimates."""
    records, torch_s = request.records, request.torch_s
    first = _initial(ray, actor)
    others = ray.get(actor.other_devices.remote())
    if others:
        warnings.warn(f"{records}: skipped {sum(others.values())} record(s) of target "
                      f"{request.target!r} measured on another device "
                      f"({describe_devices(others)}); this run tunes its own", stacklevel=6)
    notify(callbacks, "on_start", _with_torch(first, torch_s), stopped(0, first.trials, records))
    end = math.inf if request.seconds is None else time.monotonic() + request.seconds
    while time.monotonic() < end and (step := ray.get(actor.step.remote())) is not None:
        summary, new = _with_torch(step[0], torch_s), step[1]
        where = stopped(summary.round, summary.trials, records)
        notify(callbacks, "on_records", new, where)
        notify(callbacks, "on_round", summary, where)
    setup = ray.get(actor.setup.remote())
    result = ray.get(actor.result.remote())
    result.setup = setup
    result.estimated_latency_s += torch_s
    result.torch_s = torch_s
    result.rounds = [dataclasses.replace(p, estimated_s=p.estimated_s + torch_s)
                     for p in result.rounds]
    return result


def _with_torch(summary, torch_s: float):
    """A round's summary with the PyTorch part added to its estimate."""
    return dataclasses.replace(summary, estimated_s=summary.estimated_s + torch_s,
                               torch_s=torch_s)

