"""tune_network(): the driver entry point. The one core module that starts Ray and the
actors; it imports them only when called, so the core stays importable without Ray."""
from __future__ import annotations

import os
import warnings
from typing import Sequence

import torch

from .codegen.build import cpu_info
from .codegen.schedules import unsupported_reason
from .errors import RaytuneError, UnknownTargetError
from .measure import MeasureOptions
from .records import RecordWriter, load_records
from .target import parse_target
from .tuner import TuneOptions, TuningResult


class TuneError(RaytuneError):
    """Tuning could not start (bad address, unwritable records, unsupported target)."""


def tune_network(model: torch.nn.Module, example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                 target: str = "llvm", trials: int = 200, records: str | None = None,
                 resume: bool = True, address: str | None = None,
                 num_measurers: int | None = None, num_builders: int | None = None,
                 batch: int = 8, seed: int = 0, threads: int = 1, verbose: bool = True
                 ) -> TuningResult:
    """Tune every task of `model` for `target` with a budget of `trials` measurements.

    Each candidate runs with `threads` threads on a measurer that owns that many cores.
    Starts a local Ray when none is running, or joins `address`. With `resume`, the
    measurements already in `records` count toward the budget and are never repeated,
    and the cost model starts trained on them. Returns the best record per task and the
    estimated network latency (sum of weight x best latency)."""
    from . import extract_tasks

    tgt = parse_target(target)
    if tgt.kind != "llvm":
        raise UnknownTargetError(
            f"target {target!r}: only 'llvm' targets can be tuned in this build (CUDA "
            "kernels render and compile with NVRTC, but the tuner does not drive GPU "
            "measurers yet)")
    if records:
        RecordWriter(records).close()  # an unwritable path fails here, before any work
    if address:
        check_reachable(address)
    elif threads < 1 or (num_measurers or 1) * threads > len(os.sched_getaffinity(0)):
        raise TuneError(f"{num_measurers or 1} measurer(s) x {threads} thread(s) need more "
                        f"cores than this machine gives us ({len(os.sched_getaffinity(0))})")
    tasks = _tunable(extract_tasks(model, example_inputs, tgt))
    history = load_records(records).records if (records and resume) else []
    ray = _start_ray(address)
    return _run(ray, tasks, str(tgt), tgt.mcpu, records, history, trials, batch, seed,
                threads, num_measurers, num_builders, verbose)


def _tunable(tasks):
    skipped = [(t, unsupported_reason(t.compute)) for t in tasks]
    skipped = [(t, r) for t, r in skipped if r]
    if skipped:
        warnings.warn("not tuned (no kernel for them yet): " +
                      "; ".join(f"{t.compute.describe()} ({r})" for t, r in skipped),
                      stacklevel=3)
    return [t for t in tasks if not unsupported_reason(t.compute)]


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


def _run(ray, tasks, target, mcpu, records, history, trials, batch, seed, threads,
         num_measurers, num_builders, verbose) -> TuningResult:
    from actors.tuning_actors import TaskSchedulerActor

    from .progress import ProgressView

    opts = TuneOptions(trials=trials, batch=batch, seed=seed, threads=threads)
    mopts = MeasureOptions(threads=threads, min_repeat_ms=10, repeats=3, timeout_s=30,
                           cold_weights=opts.cold_weights)
    from actors.tuning_actors import ON_HEAD

    cluster = len([n for n in ray.nodes() if n["Alive"]]) > 1
    actor = TaskSchedulerActor.options(**ON_HEAD).remote(
        [t.to_json() for t in tasks], target, cpu_info(mcpu).name, cpu_info(mcpu), records,
        [r.to_json() for r in history], opts, num_measurers, num_builders, mopts, mcpu,
        cluster)
    try:
        view = ProgressView(trials) if verbose else None
        if view:
            view.__enter__()
            view.update(ray.get(actor.initial.remote()))
        while (summary := ray.get(actor.step.remote())) is not None:
            if view:
                view.update(summary)
        if view:
            view.__exit__(None, None, None)
        result = ray.get(actor.result.remote())
    finally:
        ray.kill(actor)
    if verbose:
        print(f"estimated latency {result.estimated_latency_s * 1e3:.3f} ms over "
              f"{len(result.best)} tasks, {result.trials} trials; records: {records}")
    return result

