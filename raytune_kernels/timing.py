"""The timing protocol: warm-up, grow `number` until one repeat lasts min_repeat_ms,
several repeats, keep every repeat, report the median. Inputs are the caller's job: they
must hold random values (never uninitialised memory).

Settling (`settle` > 0): a set of repeats whose median lies more than `settle` above its
fastest repeat was disturbed while most of it ran: another process on the cores, a vCPU
the hypervisor descheduled (an OpenMP barrier then waits out the lost thread's time slice:
records of a 0.12 ms kernel timed at 5.7-11 ms on a shared VM). Such a set is timed again
after a short pause, up to `retries` times, and the most settled set is kept, all of its
repeats; a disturbance that outlasts the retries stays in the set, as measured."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


RETRY_PAUSE_S = 0.05  # before a disturbed set of repeats is timed again


@dataclass(frozen=True)
class TimingOptions:
    warmup: int = 2
    min_repeat_ms: float = 20.0
    repeats: int = 5
    settle: float = 0.0  # a set whose median is this far above its fastest is retimed (0: off)
    retries: int = 0  # how many times a disturbed set is timed again


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
    times = _repeats(run, number, opts.repeats, between)
    for _ in range(opts.retries if opts.settle > 0 else 0):
        if unsettled(times) <= opts.settle:
            break
        time.sleep(RETRY_PAUSE_S)
        run(number)  # warm again after the pause
        again = _repeats(run, number, opts.repeats, between)
        if unsettled(again) < unsettled(times):
            times = again
    return times


def unsettled(times: list[float]) -> float:
    """How far the median of a set of repeats lies above its fastest, relative."""
    return statistics.median(times) / min(times) - 1 if times and min(times) > 0 else 0.0


def _repeats(run: Callable[[int], float], number: int, repeats: int,
             between: Callable[[], object] | None) -> list[float]:
    times = []
    for _ in range(repeats):
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
