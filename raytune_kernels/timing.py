"""The timing protocol: warm-up, grow `number` until one repeat lasts min_repeat_ms,
several repeats, keep every repeat, report the median. Inputs are the caller's job: they
must hold random values (never uninitialised memory)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class TimingOptions:
    warmup: int = 2
    min_repeat_ms: float = 20.0
    repeats: int = 5


def time_fn(fn: Callable[[], object], opts: TimingOptions = TimingOptions(),
            between: Callable[[], object] | None = None) -> list[float]:
    """Seconds per call of `fn`, one entry per repeat; `between` runs before each repeat
    (a cache flush), outside the timed region."""
    for _ in range(opts.warmup):
        fn()
    return time_runs(lambda number: _run(fn, number), opts, between)


def time_runs(run: Callable[[int], float], opts: TimingOptions = TimingOptions(),
              between: Callable[[], object] | None = None) -> list[float]:
    """The protocol after warm-up, for any clock: run(number) makes `number` calls and
    returns the seconds they took (wall time on a CPU, CUDA events on a GPU)."""
    number, elapsed = 1, run(1)
    while elapsed * 1e3 < opts.min_repeat_ms:  # grow `number` until one repeat is long enough
        grow = opts.min_repeat_ms / max(elapsed * 1e3, 1e-3)
        number = max(number + 1, int(number * min(grow * 1.2, 16)))
        elapsed = run(number)
    times = []
    for _ in range(opts.repeats):
        if between is not None:
            between()
        times.append(run(number) / number)
    return times


def _run(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - start


def median(times: list[float]) -> float:
    return statistics.median(times)
