"""Evolutionary search, ask/tell: propose(n) configs, observe(results).

Each task's search keeps a pool of candidates it has analysed (features and estimate, from
the backend's `analyze`), so that a config is lowered once, not once per proposal. A
proposal adds fresh random samples to the pool (evolution alone drifts to where the model
over-rates configs; fresh samples keep whole regions of the space in view), then evolves
it for a few generations: children of the best measured configs and of the pool's best
ranked, by mutation and crossover. The pool is ranked by the cost model, scored in one
batch per model version, and the best not measured yet are proposed; the pool keeps its
best `keep` candidates for the next proposal, so evolution continues across rounds.

Where the backend has an analytic estimate (the CPU's cycles, cpu/estimate.py) the
ranking blends the model with it: the estimate alone before any measurement, the model
more as the task's own measurements grow, since a model trained on other tasks' records
has learnt their good configs rather than this task's. A fraction epsilon of every batch
is random, so neither guide blinds the search. A config already measured for the task
(errors included), or proposed and not yet observed, is never proposed again.

A space of several kernel families (a UnionSpace's algorithms: direct, Winograd F(2x2),
F(4x4); within one, vector widths: 8 lanes, or 16 ending in a masked vector) is searched
per family as well. The model learns mostly from the family that led early (or that a
resumed history holds, from before a family joined the space), ranks the others'
candidates by what it learnt there, and evolution breeds from the best measured, so a
family whose first random trials lost is left with the random fraction of later batches,
though its good configs (few, where its space is mostly slow) may beat the leader's. So
the families in contention (measured, with a best within `contend` of the task's best)
share each batch's guided picks round-robin, each its own best-ranked candidates, and each
has its own best measured and ranked configs among the parents; the others get the
ranking's and the random share. Only once the task has `share_after` measurements of its
own: before that, the ranking and the estimate choose better (at 200 trials for all of
ResNet-18, sharing from the first batch cost 4-11% of the estimated latency). A family
not measured yet never contends; once the task has those measurements, each family of the
pool that none of them is from (one that joined the space after a resumed task's records
were made, or that the random share missed) has its best-ranked candidate measured in the
next batch (`probe`), so that it can enter contention on its own merit.

The search knows no backend's internals: the backend's `analyze` (features and estimate
of a batch of configs, see backend.py) and the cost model are its plug-ins.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import numpy as np

from raytune_kernels.backend import Backend
from raytune_kernels.space import Config, completed
from raytune_kernels.tune.cost_model import CostModel
from raytune_kernels.task import Task


@dataclass(frozen=True)
class SearchOptions:
    population: int = 32  # best-ranked candidates (beside the elite) that parent children
    generations: int = 2  # per proposal; the pool carries evolution on to the next one
    first_generations: int = 3  # at the first proposal with a trained model, which
    first_children: int = 48  # evolves the task's pool from random samples
    children: int = 24  # per generation
    elite: int = 12  # best measured configs that parent children
    epsilon: float = 0.15
    fresh: int = 16  # random samples analysed per proposal
    initial: int = 352  # random samples analysed at a task's first guided proposal
    keep: int = 1024  # analysed candidates kept between proposals
    # own measurements at which the model and the estimate weigh equally; 0: no estimate
    estimate_trials: int = 16
    # kernel families (algorithm, and these knobs' values) in contention share the picks
    # and have their own parents
    part_picks: bool = True
    family_knobs: tuple[str, ...] = ("lanes",)
    contend: float = 1.3  # a measured family within this factor of the task's best
    share_after: int = 32  # the task's own measurements before families share the picks
    part_parents: int = 4  # of each contending family: best measured, and best ranked
    probe: int = 1  # best-ranked candidates measured of each family the task has none of


class EvolutionarySearch:
    def __init__(self, task: Task, space, backend: Backend, seed: int = 0,
                 opts: SearchOptions = SearchOptions()):
        """`backend` gives the features and estimate (backend.analyze); `space` is
        normally backend.space(task.compute)."""
        self.task, self.space, self.opts = task, space, opts
        self.analyze, self.has_estimate = backend.analyze, backend.has_estimate
        self._seeds: list[Config] | None = None  # backend.seeds not proposed yet
        self._seed_from = backend.seeds
        self.rng = random.Random(f"{seed}:{task.key}")
        self.measured: dict[Config, float] = {}
        self.pending: set[Config] = set()  # proposed, not observed yet
        self.pool = CandidatePool()
        self.features: dict[Config, np.ndarray] = {}  # of the latest proposal's picks
        self._evolved = False  # whether a proposal has evolved the pool yet
        # (observe() count then, _contending(), the families measured)
        self._contenders: tuple = (None, [], frozenset())
        self._observed = 0  # observe() calls

    @property
    def exhausted(self) -> bool:
        return len(self.measured) >= self.space.count()

    def best(self) -> tuple[Config | None, float]:
        if not self.measured:
            return None, math.inf
        cfg = min(self.measured, key=self.measured.get)
        return cfg, self.measured[cfg]

    def observe(self, cfgs: list[Config], seconds: list[float]) -> None:
        """Measured configs and their times. A resumed config written before a knob
        joined the space is the point it was (space.completed), so that it is never
        proposed again and mutates like any other."""
        self._observed += 1
        for c, t in zip(cfgs, seconds):
            self.pending.discard(c)
            full = completed(c, self.space)
            if full != c and c not in self.space and full in self.space:
                c = full
            self.measured[c] = min(t, self.measured.get(c, math.inf))
        self._drop(cfgs)  # measured without being proposed from the pool (resumed, say)

    def _drop(self, cfgs: list[Config]) -> None:
        gone = {self.pool.index[c] for c in cfgs if c in self.pool.index}
        if gone:
            self.pool.keep([i for i in range(len(self.pool)) if i not in gone])

    def prepare(self, model: CostModel) -> None:
        """Do now what the first guided proposal would: analyse the initial pool, and
        build the space's tables that mutation reads. A head prepares every task's
        search before it hands out work, so that this burst (tasks x `initial` configs)
        does not fall on the rounds that keep measurers busy."""
        if not len(self.pool):
            self._add(self._random(self.opts.initial, set()), model)
        self.space.prepare()

    def propose(self, n: int, model: CostModel) -> list[Config]:
        """n configs to measure: the backend's seeds first (what the task runs untuned;
        those not measured yet, until all are), then the search's own picks."""
        self.features = {}
        seeds = self._take_seeds(n)
        return seeds + (self._propose(n - len(seeds), model) if n > len(seeds) else [])

    def _take_seeds(self, n: int) -> list[Config]:
        if self._seeds is None:
            self._seeds = [c for c in self._seed_from(self.task.compute) if c in self.space]
        fresh = [c for c in dict.fromkeys(self._seeds) if not self._taken(c)]
        seeds, self._seeds = fresh[:n], fresh[n:]
        self.pending.update(seeds)
        self._drop(seeds)
        return seeds

    def _propose(self, n: int, model: CostModel) -> list[Config]:
        n_random = max(1, round(n * self.opts.epsilon)) if n > 1 else 0
        self.features = {}
        if not model.trained and not self._estimating:
            chosen = self._random(n, set())  # no guide for this device yet: explore
            self._drop(chosen)
        else:
            self._grow(model)
            order = self._order(model)
            best = self._picks(order, n - n_random)
            chosen = [self.pool.configs[i] for i in best]
            self.features = dict(zip(chosen, self.pool.x[best]))
            chosen += self._random(n - len(chosen), set(chosen))
            gone = {self.pool.index[c] for c in chosen if c in self.pool.index}
            self.pool.keep([i for i in order if i not in gone][: self.opts.keep])
        self.pending.update(chosen)  # the pool holds no config measured or pending
        return chosen

    @property
    def _estimating(self) -> bool:
        """Whether the analytic estimate guides this search (a backend that has one)."""
        return self.has_estimate and self.opts.estimate_trials > 0

    def _taken(self, cfg: Config) -> bool:
        return cfg in self.measured or cfg in self.pending

    def sample(self, n: int) -> list[Config]:
        """n distinct random configs not measured yet (the unguided baseline's proposals)."""
        return self._random(n, set())

    def _random(self, n: int, taken: set) -> list[Config]:
        out: list[Config] = []
        for _ in range(max(50, 20 * n)):
            if len(out) == n:
                break
            c = self.space.sample(self.rng)
            if not self._taken(c) and c not in taken:
                taken.add(c)
                out.append(c)
        return out

    def _grow(self, model: CostModel) -> None:
        """Fresh samples into the pool (`initial` of them into an empty one), then, with
        a trained model, `generations` of children."""
        size = self.opts.fresh if len(self.pool) else self.opts.initial
        self._add(self._random(size, set(self.pool.index)), model)
        if not model.trained:
            return  # the estimate alone ranks random samples, as it has nothing to evolve
        first, self._evolved = not self._evolved, True
        generations, children = ((self.opts.first_generations, self.opts.first_children)
                                 if first else (self.opts.generations, self.opts.children))
        for _ in range(generations):
            order = self._order(model)
            ranked = [self.pool.configs[i] for i in order[: self.opts.population]]
            done = sorted((c for c, t in self.measured.items() if math.isfinite(t)),
                          key=self.measured.get)
            parents = done[: self.opts.elite] + ranked + self._part_parents(order, done)
            if parents:
                self._add(self._children(parents, children), model)

    def _children(self, parents: list[Config], n: int) -> list[Config]:
        out: dict[Config, None] = {}
        for _ in range(2 * n):
            if len(out) == n:
                break
            c = self._child(parents)
            if c not in self.pool.index and not self._taken(c):
                out[c] = None  # new to the pool, which holds nothing measured or pending
        return list(out)

    def _add(self, cfgs: list[Config], model: CostModel) -> None:
        if not cfgs:
            return
        x, cost = self.analyze(self.task.compute, cfgs)  # one lowering serves both
        estimates = -cost if self._estimating else np.zeros(len(cfgs))
        self.pool.add(cfgs, x, estimates, model, [self._family(c) for c in cfgs])

    def _order(self, model: CostModel) -> np.ndarray:
        """The pool's indices, best first, by the model's rank blended with the
        estimate's. The model's weight grows with the records n of this task it has
        learnt, as (n + 4) / (n + 4 + estimate_trials): a model trained on other tasks'
        records knows their good configs, not this one's (and it retrains only every
        few rounds), while the estimate knows every task equally little (and is absent
        off the CPU). The model always keeps some weight: the estimate ignores loop order
        and layout, and evolution under the estimate alone runs into what it ignores."""
        key = _fractional_ranks(self.pool.scores(model))
        if self._estimating:
            own = model.learnt.get(self.task.key, 0)
            w = (own + 4) / (own + 4 + self.opts.estimate_trials)
            key = w * key + (1 - w) * _fractional_ranks(self.pool.estimates)
        return np.argsort(-key, kind="stable")

    def _family(self, cfg: Config) -> tuple:
        """The kernel family of a config: its algorithm in a union space, and its values of
        `family_knobs` (the vector width)."""
        key = getattr(self.space, "key", None)
        return (cfg.get(key) if key else None,) + tuple(cfg.get(k)
                                                      for k in self.opts.family_knobs)

    @property
    def _per_family(self) -> bool:
        """Whether families share picks and are probed: `part_picks`, once the task has
        `share_after` measurements of its own."""
        return self.opts.part_picks and len(self.measured) >= self.opts.share_after

    def _contending(self) -> list[tuple]:
        """The kernel families in contention (module docstring), the best measured
        first; none while fewer than two are."""
        return self._measured_families()[0] if self._per_family else []

    def _measured_families(self) -> tuple[list[tuple], frozenset]:
        """(the families in contention, every family measured), recomputed only after
        new measurements."""
        if self._contenders[0] == self._observed:  # nothing measured since
            return self._contenders[1:]
        best: dict[tuple, float] = {}
        for c, t in self.measured.items():
            f = self._family(c)
            best[f] = min(t, best.get(f, math.inf))
        lead = min(best.values(), default=math.inf)
        names = sorted((f for f, t in best.items() if t <= self.opts.contend * lead),
                       key=lambda f: (best[f], repr(f))) if math.isfinite(lead) else []
        self._contenders = (self._observed, names if len(names) > 1 else [], frozenset(best))
        return self._contenders[1:]

    def _probes(self, order: np.ndarray) -> list[int]:
        """The `probe` best-ranked candidates of each family in the pool that the task has
        no measurement of, nor one pending (module docstring)."""
        if not self._per_family or self.opts.probe < 1:
            return []
        families = self.pool.families
        seen = self._measured_families()[1] | {self._family(c) for c in self.pending}
        left = {f: self.opts.probe for f in set(families) - seen}
        out = []
        for i in order:
            if not left:
                break
            f = families[i]
            if f in left:
                out.append(int(i))
                left[f] -= 1
                if not left[f]:
                    del left[f]
        return out

    def _picks(self, order: np.ndarray, n: int) -> np.ndarray:
        """The n best of `order`: first the probes of families not measured yet (at most
        half of n), then the rest shared round-robin among the contending kernel families
        (the best measured first), each taking its own best-ranked candidates. A family
        out of contention gets only the batch's random share."""
        probes = self._probes(order)[: n // 2]
        if probes:
            order = order[~np.isin(order, probes)]
        rest = self._shared(order, n - len(probes))
        return np.concatenate([np.array(probes, dtype=order.dtype), rest]) if probes \
            else rest

    def _shared(self, order: np.ndarray, n: int) -> np.ndarray:
        parts = self._contending()
        if not parts or n < 2:
            return order[:n]
        out, families = [], self.pool.families

        def ranked(part):
            return (i for i in order if families[i] == part)

        queues = {part: ranked(part) for part in parts}
        while len(out) < n and queues:
            for part in list(queues):
                i = next(queues[part], None)
                if i is None:
                    del queues[part]
                elif len(out) < n:
                    out.append(i)
        return np.array(out, dtype=order.dtype)

    def _part_parents(self, order: np.ndarray, done: list[Config]) -> list[Config]:
        """Parents for each contending family: its best measured and best ranked configs
        (`part_parents` of each), so that its part of the pool evolves too."""
        parts, k = self._contending(), self.opts.part_parents
        if not parts:
            return []
        out, families, configs = [], self.pool.families, self.pool.configs
        done_families = [self._family(c) for c in done]
        for part in parts:
            out += itertools.islice((c for c, f in zip(done, done_families) if f == part), k)
            out += itertools.islice((configs[i] for i in order if families[i] == part), k)
        return out

    def _child(self, pop: list[Config]) -> Config:
        a = self.rng.choice(pop)
        if self.rng.random() < 0.3 and len(pop) > 1:
            a = self.space.crossover(a, self.rng.choice(pop), self.rng)
        return self.space.mutate(a, self.rng)


class CandidatePool:
    """The analysed candidates of one task's search: configs, their feature rows and
    estimates, and their scores by the latest model (all rescored in one batch when the
    model changes, new rows scored as they come)."""

    def __init__(self):
        self.configs: list[Config] = []
        self.families: list[tuple] = []  # each candidate's kernel family
        self.index: dict[Config, int] = {}
        self.x: np.ndarray = np.zeros((0, 0), np.float32)
        self.estimates = np.zeros(0)
        self._scores = np.zeros(0, np.float32)
        self._scored_by: tuple | None = None

    def __len__(self) -> int:
        return len(self.configs)

    def add(self, cfgs: list[Config], x: np.ndarray, estimates: np.ndarray,
            model: CostModel, families: list[tuple]) -> None:
        """Append analysed configs (none of them in the pool yet) and their families."""
        for c in cfgs:
            self.index[c] = len(self.configs)
            self.configs.append(c)
        self.families += families
        self.x = x if not len(self.x) else np.concatenate([self.x, x])
        self.estimates = np.concatenate([self.estimates, estimates])
        if self._scored_by == model.identity:
            self._scores = np.concatenate([self._scores, model.predict(x)])

    def scores(self, model: CostModel) -> np.ndarray:
        """Every candidate's score by `model`, predicted anew only when it changed."""
        if self._scored_by != model.identity or len(self._scores) != len(self.configs):
            self._scores = model.predict(self.x) if len(self.configs) else self._scores
            self._scored_by = model.identity
        return self._scores

    def keep(self, rows: list[int]) -> None:
        """Keep only the candidates at `rows`, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(self._scores) == len(self.configs):
            self._scores = self._scores[rows]
        else:
            self._scored_by = None
        self.configs = [self.configs[i] for i in rows]
        self.families = [self.families[i] for i in rows]
        self.index = {c: i for i, c in enumerate(self.configs)}
        self.x, self.estimates = self.x[rows], self.estimates[rows]


def seeds_unmeasured(backend: Backend, task: Task, measured: list[Config]) -> bool:
    """Whether a seed of `backend` for `task` (what the task runs untuned, in its space) is
    not among the configs `measured`: resumed records of some other configs then must not
    stand for a warmed-up task, or its search would never propose the seed (the scheduler
    gives a warmed-up task rounds only for their expected gain)."""
    seeds = backend.seeds(task.compute)
    if not seeds:
        return False
    space, done = backend.space(task.compute), set(measured)
    return any(c in space and c not in done for c in seeds)


def _fractional_ranks(values) -> np.ndarray:
    """Rank of each value in [0, 1] (ties share their mean rank), highest value 1."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return np.ones(len(v))
    ranks = np.empty(len(v))
    ranks[np.argsort(v, kind="stable")] = np.arange(len(v))
    _, tie, counts = np.unique(v, return_inverse=True, return_counts=True)
    return (np.bincount(tie, ranks) / counts)[tie] / (len(v) - 1)
