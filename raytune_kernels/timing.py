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
    number, elapsed = 1, _run(fn, 1)
    while elapsed * 1e3 < opts.min_repeat_ms:  # grow `number` until one repeat is long enough
        grow = opts.min_repeat_ms / max(elapsed * 1e3, 1e-3)
        number = max(number + 1, int(number * min(grow * 1.2, 16)))
        elapsed = _run(fn, number)
    times = []
    for _ in range(opts.repeats):
        if between is not None:
            between()
        times.append(_run(fn, number) / number)
    return times


def _run(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - start


def median(times: list[float]) -> float:
    return statistics.median(times)
