"""The tuning loop, Ray-free: rounds of (pick a task, propose a batch, measure, record,
learn) until the trial budget is spent or every task has converged.

What it is plugged into decides where things run: `measure` is any function from
(task, config) pairs to MeasureResults (the Ray pipeline, or the fake measurer in tests),
and the SearchPool holds the searches and the cost model (locally here; as search actors
and a cost-model actor in actors/). The Tuner is the single writer of records.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Collection, Hashable, Iterator, Protocol, Sequence

from raytune_kernels.backend import Backend
from raytune_kernels.space import Config
from raytune_kernels.tune.cost_model import CostModel, training_set
from raytune_kernels.measure import MeasureResult
from raytune_kernels.tune.callbacks import Callback, notify, stopped
from raytune_kernels.tune.records import (Record, RecordWriter, best_per_task, config_key,
                                          measured_on, other_devices, record_of)
from raytune_kernels.tune.result import RoundPoint, RoundSummary, TaskRow, TuningResult
from raytune_kernels.tune.task_scheduler import SchedulerOptions, TaskScheduler
from raytune_kernels.tune.search import EvolutionarySearch, SearchOptions, seeds_unmeasured
from raytune_kernels.task import Task

Measure = Callable[[list[tuple[Task, Config]]], list[MeasureResult]]
# Tuner.stream's measurement: start a round (a handle back), wait for some to finish
Launch = Callable[[list[tuple[Task, Config]]], Hashable]
Wait = Callable[[list[Hashable]], list[tuple[Hashable, list[MeasureResult]]]]


class SearchPool(Protocol):
    """What the Tuner asks of the searches; a pool may also have `propose_many(asks)`,
    [(task key, n)] -> one proposal each, made in parallel (Tuner.stream uses it)."""

    def propose(self, key: str, n: int) -> list[Config]: ...
    def observe(self, key: str, cfgs: list[Config], seconds: list[float]) -> None: ...
    def learn(self, records: list[Record]) -> None: ...
    def exhausted(self, key: str) -> bool: ...
    def unseeded(self, key: str, measured: list[Config]) -> bool: ...


class LocalSearchPool:
    """One evolutionary search per task and one cost model, all in this process. The
    target's `backend` gives the schedule spaces, the features and the estimate."""

    def __init__(self, tasks: list[Task], backend: Backend, seed: int = 0,
                 opts: SearchOptions = SearchOptions()):
        self.tasks = {t.key: t for t in tasks}
        self.backend, self.model, self.records, self.features = backend, CostModel(), [], {}
        self.searches = {t.key: EvolutionarySearch(t, backend.space(t.compute), backend, seed,
                                                   opts) for t in tasks}

    def propose(self, key: str, n: int) -> list[Config]:
        search = self.searches[key]
        cfgs = search.propose(n, self.model)
        for c, x in search.features.items():  # analysed already: the model learns them
            self.features[(key, config_key(c.to_json()))] = x
        return cfgs

    def observe(self, key: str, cfgs: list[Config], seconds: list[float]) -> None:
        self.searches[key].observe(cfgs, seconds)

    def learn(self, records: list[Record]) -> None:
        """Add `records`; retrain the model when they grew enough (cost_model.refit_due)."""
        self.records += records
        self.model.refit(len(self.records), lambda: training_set(
            self.tasks, self.records, self.backend.featurize, self.features))

    def exhausted(self, key: str) -> bool:
        return self.searches[key].exhausted

    def unseeded(self, key: str, measured: list[Config]) -> bool:
        return seeds_unmeasured(self.backend, self.tasks[key], measured)

    def prepare(self) -> None:
        """Every search's initial pool analysed and its space's tables built, ahead of
        the rounds (EvolutionarySearch.prepare)."""
        for search in self.searches.values():
            search.prepare(self.model)


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 200
    batch: int = 8
    seed: int = 0
    threads: int = 1  # threads every candidate runs with; records at other counts are ignored
    cold_weights: bool = True  # weights out of cache while timed (see MeasureOptions)
    scheduler: SchedulerOptions = SchedulerOptions()
    search: SearchOptions = SearchOptions()
    # Propose the next round while this one is measured (Tuner.step). Only where measuring
    # happens apart from proposing (pinned measurer processes, a GPU): in one process, or on
    # the measuring cores, proposals would be timed with the kernels.
    overlap: bool = False


class Tuner:
    def __init__(self, tasks: list[Task], target: str, device: str, measure: Measure,
                 pool: SearchPool, writer: RecordWriter | None = None,
                 history: list[Record] = (), opts: TuneOptions = TuneOptions(),
                 isa: str | None = None):
        """`device` (and, on a CPU, `isa`) names what measures: the history resumed is
        the records of this target measured there; `other_devices` counts the rest."""
        self.tasks, self.target, self.device, self.isa = tasks, target, device, isa
        self.measure, self.pool, self.writer, self.opts = measure, pool, writer, opts
        self.scheduler = TaskScheduler(tasks, opts.seed, opts.scheduler)
        self.records: list[Record] = []
        self.last: list[Record] = []  # the records of the latest round
        self.curve: list[RoundPoint] = []
        self.round, self.start = 0, time.perf_counter()
        self._ahead: tuple[int, Task, list[Config]] | None = None  # proposed, not measured
        mine = [r for r in history if r.target == target and r.threads == opts.threads
                and r.cold_weights == opts.cold_weights]
        self.other_devices = other_devices(mine, device, isa)
        self._resume([r for r in mine if measured_on(r, device, isa)])

    def _resume(self, history: list[Record]) -> None:
        index = {t.key: i for i, t in enumerate(self.tasks)}
        mine = [r for r in history if r.task_key in index]
        for i, task in enumerate(self.tasks):
            recs = [r for r in mine if r.task_key == task.key]
            if recs:
                cfgs = [Config.from_json(r.config) for r in recs]
                self.pool.observe(task.key, cfgs, [r.median for r in recs])
                self.scheduler.resume(i, [r.median for r in recs],
                                      warmed=not self.pool.unseeded(task.key, cfgs))
        self.records = list(mine)
        if mine:
            self.pool.learn(mine)  # a resumed run starts with a trained model

    def step(self) -> RoundSummary | None:
        """One round; None when the budget is spent or every task has converged.

        With `overlap`, the round after this one is chosen and proposed while this one is
        measured (building and timing took 2/3 of a round, proposing and learning the
        rest, tuning ResNet-18 on 2 cores). That round is then chosen one round early:
        without this round's results, among the other tasks (none, when this is the only
        one left: it is chosen after this round instead), by a cost model that has not yet
        learnt from this round."""
        nxt, self._ahead = self._ahead or self._next_round(), None
        if nxt is None:
            return None
        i, task, cfgs = nxt
        if not self.opts.overlap:
            return self._run_round(i, task, cfgs, self.measure([(task, c) for c in cfgs]))
        with ThreadPoolExecutor(1, thread_name_prefix="measure") as executor:
            measuring = executor.submit(self.measure, [(task, c) for c in cfgs])
            try:
                self._ahead = self._next_round(busy=(i,), in_flight=len(cfgs))
            except BaseException:  # this round's records are written before it stops
                self._run_round(i, task, cfgs, measuring.result())
                raise
            results = measuring.result()
        return self._run_round(i, task, cfgs, results)

    def _next_round(self, busy: Collection[int] = (), in_flight: int = 0
                    ) -> tuple[int, Task, list[Config]] | None:
        """(task index, task, configs) of the next round, or None when nothing is left;
        `busy`: tasks with a round being measured, which no other round joins;
        `in_flight`: the trials of those rounds."""
        while self.spent + in_flight < self.opts.trials:
            i = self.scheduler.next_task(busy=busy)
            if i is None:
                return None
            task = self.tasks[i]
            cfgs = self.pool.propose(task.key, self._round_size(i, in_flight))
            if not cfgs:  # nothing left to try for this task
                self.scheduler.update(i, [], exhausted=True)
                continue
            return i, task, cfgs
        return None

    def _next_rounds(self, k: int, busy: set[int], in_flight: int
                     ) -> list[tuple[int, Task, list[Config]]] | None:
        """Up to `k` rounds: their tasks chosen one after another as `_next_round` does
        (a busy task only when no other is left), their configs proposed in one call of
        the pool's `propose_many` where it has one. None when no task is left; a task
        whose proposal comes back empty is exhausted and takes no round."""
        picked: list[tuple[int, int]] = []  # (task index, trials)
        busy = set(busy)
        while len(picked) < k and self.spent + in_flight < self.opts.trials:
            i = self.scheduler.next_task(busy=busy)
            i = self.scheduler.next_task() if i is None and busy else i
            if i is None:
                break
            n = self._round_size(i, in_flight)
            picked.append((i, n))
            busy.add(i)
            in_flight += n
        if not picked:
            return None
        asks = [(self.tasks[i].key, n) for i, n in picked]
        many = getattr(self.pool, "propose_many", None)
        proposals = many(asks) if many else [self.pool.propose(key, n) for key, n in asks]
        rounds = []
        for (i, _), cfgs in zip(picked, proposals):
            if cfgs:
                rounds.append((i, self.tasks[i], cfgs))
            else:  # nothing left to try for this task
                self.scheduler.update(i, [], exhausted=True)
        return rounds

    def _round_size(self, i: int, in_flight: int = 0) -> int:
        """`batch` trials, or fewer while tasks are still warming up and the budget left
        cannot give each of them a full batch: a budget under tasks x batch (160 trials for
        ResNet-18's 21 tasks at batch 8) otherwise left the last tasks with no trial at all,
        and the estimate infinite."""
        left = self.opts.trials - self.spent - in_flight
        states, warmup = self.scheduler.states, self.scheduler.opts.warmup
        if states[i].rounds < warmup:
            cold = sum(1 for j in self.scheduler.active() if states[j].rounds < warmup)
            left = max(1, left // cold)
        return min(self.opts.batch, left)

    def _run_round(self, i: int, task: Task, cfgs: list[Config],
                   results: list[MeasureResult]) -> RoundSummary:
        new = [record_of(task.key, self.target, self.device, c.to_json(), r, self.opts.threads,
                         self.opts.cold_weights, self.isa) for c, r in zip(cfgs, results)]
        if self.writer is not None:
            self.writer.write_batch(new)
        self.records += new
        seconds = [r.median for r in results]
        self.pool.observe(task.key, cfgs, seconds)
        self.scheduler.update(i, seconds, self.pool.exhausted(task.key))
        self.pool.learn(new)
        self.round += 1
        self.last = new
        summary = RoundSummary(self.round, i, self.rows(), self.scheduler.objective(),
                               self.spent, self.opts.trials, time.perf_counter() - self.start,
                               sum(r.ok for r in results), error_counts(new))
        self.curve.append(summary.point())
        return summary

    def initial(self) -> RoundSummary:
        """The task table before this run's first round (round 0)."""
        return RoundSummary(0, -1, self.rows(), self.scheduler.objective(), self.spent,
                            self.opts.trials, 0.0, 0, {})

    @property
    def spent(self) -> int:
        """Trials spent: this run's and, on resume, the earlier runs' on these tasks."""
        return len(self.records)

    def rows(self) -> tuple[TaskRow, ...]:
        return tuple(TaskRow(i, s.task.key, s.task.compute.describe(), s.task.weight, s.trials,
                             s.best, s.task.flops / s.best / 1e9 if math.isfinite(s.best) else 0.0)
                     for i, s in enumerate(self.scheduler.states))

    def run(self, callbacks: Sequence[Callback] = ()) -> TuningResult:
        """Every round, telling `callbacks` (tune/callbacks.py) as the driver does."""
        return self._told(iter(self.step, None), callbacks)

    def stream(self, launch: Launch, wait: Wait, depth: int | Callable[[], int],
               callbacks: Sequence[Callback] = ()) -> TuningResult:
        """Every round, measured `depth` at a time (`streamed`), telling `callbacks` of
        each as `run` does."""
        return self._told(self.streamed(launch, wait, depth), callbacks)

    def _told(self, rounds: Iterator[RoundSummary], callbacks: Sequence[Callback]
              ) -> TuningResult:
        """Run `rounds` to the end, telling `callbacks` of the start, each round (its
        records, then its summary) and the result."""
        path = self.writer.path if self.writer else None
        notify(callbacks, "on_start", self.initial(), stopped(0, self.spent, path))
        for summary in rounds:
            where = stopped(summary.round, summary.trials, path)
            notify(callbacks, "on_records", self.last, where)
            notify(callbacks, "on_round", summary, where)
        result = self.result()
        notify(callbacks, "on_end", result, stopped(self.round, self.spent, path))
        return result

    def streamed(self, launch: Launch, wait: Wait, depth: int | Callable[[], int]
                 ) -> Iterator[RoundSummary]:
        """The rounds, `depth` of them measured at a time, as a cluster of measurers
        takes them; the summary of each as it is done (its records written).
        `launch(items)` starts measuring a round and returns its handle, `wait(handles)`
        blocks until one or more are done and returns [(handle, results)]; `depth` may be
        a function, asked before every refill (measurers come and go). A round done is
        recorded, observed and learnt from as in `step`, and the rounds that take the
        free places are proposed together (in parallel by a pool of search actors:
        `propose_many`). A task gets a second round in flight only when every task left
        has one. Rounds in flight when `launch` or `wait` raises, or when the caller stops
        asking for rounds, are not recorded."""
        flight: dict[Hashable, tuple[int, Task, list[Config]]] = {}
        places = depth if callable(depth) else (lambda: depth)
        while True:
            while len(flight) < (want := max(1, places())):
                busy = {i for i, _, _ in flight.values()}
                in_flight = sum(len(cfgs) for _, _, cfgs in flight.values())
                rounds = self._next_rounds(want - len(flight), busy, in_flight)
                if rounds is None:
                    break
                for nxt in rounds:
                    flight[launch([(nxt[1], c) for c in nxt[2]])] = nxt
            if not flight:
                return
            for handle, results in wait(list(flight)):
                yield self._run_round(*flight.pop(handle), results)

    def result(self) -> TuningResult:
        best = best_per_task(self.records, self.target, self.opts.threads)
        path = self.writer.path if self.writer else None
        by_task: dict[str, list[Record]] = {t.key: [] for t in self.tasks}
        for r in self.records:
            by_task[r.task_key].append(r)
        return TuningResult(best, self.scheduler.objective(), path, self.spent, self.tasks,
                            rounds=list(self.curve),
                            task_trials={k: len(rs) for k, rs in by_task.items()},
                            task_errors={k: error_counts(rs) for k, rs in by_task.items()})


def error_counts(records: Sequence[Record]) -> dict[str, int]:
    """How many of `records` failed, by error kind."""
    out: dict[str, int] = {}
    for r in records:
        if r.error_kind:
            out[r.error_kind] = out.get(r.error_kind, 0) + 1
    return out
