"""A fake measurer with deterministic analytic timings, for testing what sits above
measurement (search, scheduler, tuner, pipeline) anywhere, fast, without building code.

time = flops / 200 GFLOP/s, divided by one factor in [0.5, 1] per knob value. Most of a
factor is shared by every task (so a cost model can learn across tasks, as on hardware),
a little is the task's own; a config has one best point per task.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from raytune_kernels.space import Config
from raytune_kernels.measure import ERROR_KINDS, MeasureResult
from raytune_kernels.task import Task

BASE_FLOPS = 200e9


def _unit(*parts: object) -> float:
    digest = hashlib.sha256(json.dumps(parts, default=str).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2 ** 64


def analytic_seconds(task: Task, cfg: Config) -> float:
    factor = 1.0
    for name, value in cfg.knobs:
        shared, own = _unit(name, value), _unit(task.key, name, value)
        factor *= 0.5 + 0.5 * (0.8 * shared + 0.2 * own)
    return max(task.flops, 1e5) / BASE_FLOPS / factor


@dataclass
class FakeMeasurer:
    """Measures (task, config) pairs analytically; `faults` maps a config's JSON text to
    an error kind to inject. Counts calls so tests can see what was measured."""

    faults: dict[str, str] = field(default_factory=dict)
    calls: int = 0

    def measure(self, task: Task, cfg: Config) -> MeasureResult:
        self.calls += 1
        kind = self.faults.get(json.dumps(cfg.to_json(), sort_keys=True))
        if kind is not None:
            assert kind in ERROR_KINDS
            return MeasureResult.error(kind, f"injected {kind}")
        t = analytic_seconds(task, cfg)
        return MeasureResult((t * 0.99, t, t * 1.01), build_s=0.0, run_s=3 * t)


def fake_tuner(tasks: list[Task], trials: int, batch: int = 4, writer=None,
               fail_every: int = 0):
    """A Tuner of `tasks` on a FakeMeasurer (CPU spaces, no cycle estimate in the search);
    with `fail_every`, every n-th candidate measured fails, as a crash then a timeout."""
    from raytune_kernels.backend import cpu_backend
    from raytune_kernels.cpu.machine import CpuInfo, assumed_model
    from raytune_kernels.tune.search import SearchOptions
    from raytune_kernels.tune.tuner import LocalSearchPool, TuneOptions, Tuner

    fake, kinds = FakeMeasurer(), ("crashed", "timeout")

    def measure(items):
        out = []
        for t, c in items:
            r = fake.measure(t, c)
            if fail_every and fake.calls % fail_every == 0:
                r = MeasureResult.error(kinds[fake.calls // fail_every % 2], "injected")
            out.append(r)
        return out

    backend = cpu_backend(CpuInfo("test", (16, 8), 32, assumed_model("test", (16, 8))))
    search = SearchOptions(estimate_trials=0)
    return Tuner(tasks, "llvm", "test", measure, LocalSearchPool(tasks, backend, 0, search),
                 writer, [], TuneOptions(trials=trials, batch=batch, search=search))
