"""The measuring pipeline on Ray: builders work ahead while measurers stay busy.

Cores: each measurer owns `cores_per_measurer` cores (its process's affinity); builders
get the cores no measurer owns. When none are left (2 measurers on 2 cores), builds and
measurements alternate by batch instead, so that no build ever shares a core with a
measurement in flight. A measurer killed by its candidate (segfault) is restarted by Ray
and the trial recorded as `crashed`; a candidate that runs past its timeout gets its
measurer killed and replaced by a fresh one (never reused) and is recorded as `timeout`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError

from raytune_kernels.codegen.build import BuildResult
from raytune_kernels.codegen.space import Config
from raytune_kernels.measure import (BUILD_ERROR, CRASHED, TIMEOUT, MeasureOptions,
                                     MeasureResult)
from raytune_kernels.task import Task

from .measure_actors import BuilderActor, MeasurerActor


@dataclass
class PipelineStats:
    measure_busy_s: float = 0.0  # summed over measurers
    wall_s: float = 0.0
    measurers: int = 1

    @property
    def idle_fraction(self) -> float:
        total = self.wall_s * self.measurers
        return 0.0 if total <= 0 else max(0.0, 1.0 - self.measure_busy_s / total)


@dataclass
class _Slot:
    cores: tuple[int, ...]
    actor: object = None
    busy_since: float = 0.0


class MeasurePipeline:
    """Builds and measures batches of (task, config); results come back in order."""

    def __init__(self, num_measurers: int = 1, num_builders: int | None = None,
                 opts: MeasureOptions = MeasureOptions(), cores_per_measurer: int = 1,
                 mcpu: str | None = None, cores: tuple[int, ...] | None = None):
        cores = tuple(sorted(cores or os.sched_getaffinity(0)))
        need = num_measurers * cores_per_measurer
        if need > len(cores):
            raise ValueError(f"{num_measurers} measurers x {cores_per_measurer} cores need "
                             f"{need} cores; this machine offers {len(cores)}")
        self.opts, self.mcpu = opts, mcpu
        self.slots = [_Slot(cores[i * cores_per_measurer:(i + 1) * cores_per_measurer])
                      for i in range(num_measurers)]
        spare = cores[need:]
        self.phased = not spare  # no core free of measurement: alternate by batch
        builder_cores = spare or cores
        n_builders = num_builders or max(1, len(builder_cores))
        # Ray's CPU accounting matches the pinning: measurers hold their cores, builders
        # share the spare ones (none when phased: they then only run between measurements)
        share = len(spare) / n_builders
        self.builders = [BuilderActor.options(num_cpus=share).remote(builder_cores)
                         for _ in range(n_builders)]
        for slot in self.slots:
            self._start(slot)
        ray.get([s.actor.ready.remote() for s in self.slots])
        self.stats = PipelineStats(measurers=num_measurers)

    def _start(self, slot: _Slot) -> None:
        slot.actor = MeasurerActor.options(num_cpus=len(slot.cores)).remote(slot.cores, self.opts)

    def run(self, items: list[tuple[Task, Config]]) -> list[MeasureResult]:
        start = time.perf_counter()
        builds = [self.builders[i % len(self.builders)].build.remote(
            t.compute.to_json(), c.to_json(), self.mcpu) for i, (t, c) in enumerate(items)]
        if self.phased:
            ray.wait(builds, num_returns=len(builds))
        results = self._measure(items, builds)
        self.stats.wall_s += time.perf_counter() - start
        return results

    def measure_built(self, items: list[tuple[Task, Config]],
                      built: list[BuildResult]) -> list[MeasureResult]:
        """Measure libraries built elsewhere (e.g. injected faults) through the measurers."""
        return self._measure(items, [ray.put(b) for b in built])

    def _measure(self, items, builds: list) -> list[MeasureResult]:
        results: list[MeasureResult | None] = [None] * len(items)
        pending = list(range(len(items)))  # waiting for a build and a free measurer
        inflight: dict = {}  # ObjectRef -> (index, slot)
        waiting_build = {b: i for i, b in enumerate(builds)}
        ready: list[int] = []
        while pending or inflight:
            done, _ = ray.wait(list(waiting_build), num_returns=len(waiting_build),
                               timeout=0) if waiting_build else ([], [])
            for ref in done:
                ready.append(waiting_build.pop(ref))
            self._dispatch(items, builds, ready, pending, inflight, results)
            if inflight:
                self._collect(items, inflight, results)
            elif pending and not ready:
                ray.wait(list(waiting_build), num_returns=1)
        return results  # type: ignore[return-value]

    def _dispatch(self, items, builds, ready, pending, inflight, results) -> None:
        busy = [id(v[1]) for v in inflight.values()]
        free = [s for s in self.slots if id(s) not in busy]
        ready.sort()
        while free and ready:
            i = ready.pop(0)
            built: BuildResult = ray.get(builds[i])
            pending.remove(i)
            if built.error:
                results[i] = MeasureResult.error(BUILD_ERROR, built.error, built.seconds)
                continue
            slot = free.pop(0)
            task, cfg = items[i]
            slot.busy_since = time.perf_counter()
            ref = slot.actor.measure.remote(task.compute.to_json(), cfg.to_json(),
                                            built.library, built.seconds)
            inflight[ref] = (i, slot, built.seconds)

    def _collect(self, items, inflight, results) -> None:
        now = time.perf_counter()
        deadline = min(s.busy_since for _, s, _ in inflight.values()) + self.opts.timeout_s
        done, _ = ray.wait(list(inflight), num_returns=1, timeout=max(0.0, deadline - now))
        if done:
            ref = done[0]
            i, slot, build_s = inflight.pop(ref)
            self.stats.measure_busy_s += time.perf_counter() - slot.busy_since
            try:
                results[i] = MeasureResult.from_json(ray.get(ref))
            except RayActorError as exc:  # the candidate took the process down
                results[i] = MeasureResult.error(CRASHED, _first_line(exc), build_s)
                self._await_restart(slot)
            return
        for ref, (i, slot, build_s) in list(inflight.items()):
            if time.perf_counter() - slot.busy_since >= self.opts.timeout_s:
                inflight.pop(ref)
                self.stats.measure_busy_s += time.perf_counter() - slot.busy_since
                results[i] = MeasureResult.error(
                    TIMEOUT, f"ran past {self.opts.timeout_s:.0f} s; measurer replaced", build_s)
                ray.kill(slot.actor, no_restart=True)  # a timed-out actor is never reused
                self._start(slot)

    def _await_restart(self, slot: _Slot, limit_s: float = 60.0) -> None:
        """Ray restarts a crashed measurer; calls made while it restarts would fail, so the
        slot gets no work until it answers again (or is replaced after `limit_s`)."""
        end = time.perf_counter() + limit_s
        while time.perf_counter() < end:
            try:
                ray.get(slot.actor.ready.remote(), timeout=limit_s)
                return
            except RayActorError:
                time.sleep(0.1)
        ray.kill(slot.actor, no_restart=True)
        self._start(slot)

    def shutdown(self) -> None:
        for a in self.builders + [s.actor for s in self.slots]:
            ray.kill(a, no_restart=True)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"measurer process died: {text[0] if text else type(exc).__name__}"[:500]
