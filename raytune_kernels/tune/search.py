"""Evolutionary search, ask/tell: propose(n) configs, observe(results).

The population is seeded from the best measured configs and random samples, evolved by
mutation and crossover for a few generations, and ranked by the cost model together with a
pool of fresh random samples (evolution alone drifts to where the model over-rates
configs; fresh samples keep whole regions of the space in view). Where the backend has
an analytic estimate (the CPU's cycles, cpu/estimate.py) the ranking blends the model
with it: the estimate alone before any measurement, the model more as the task's own
measurements grow, since a model trained on other tasks' records has learnt their good
configs rather than this task's. A fraction epsilon of every batch is random, so neither
guide blinds the search. A config already measured for the task (errors included) is
never proposed again.

The search knows no backend's internals: the backend's `analyze` (features and estimate
of a batch of configs, see backend.py) and the cost model are its plug-ins.
"""
from __future__ import annotations

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
    population: int = 96
    generations: int = 3
    elite: int = 12
    epsilon: float = 0.15
    fresh: int = 256  # random samples ranked next to the evolved population
    # own measurements at which the model and the estimate weigh equally; 0: no estimate
    estimate_trials: int = 16


class EvolutionarySearch:
    def __init__(self, task: Task, space, backend: Backend, seed: int = 0,
                 opts: SearchOptions = SearchOptions()):
        """`backend` gives the features and estimate (backend.analyze); `space` is
        normally backend.space(task.compute)."""
        self.task, self.space, self.opts = task, space, opts
        self.analyze, self.has_estimate = backend.analyze, backend.has_estimate
        self.rng = random.Random(f"{seed}:{task.key}")
        self.measured: dict[Config, float] = {}

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
        for c, t in zip(cfgs, seconds):
            full = completed(c)
            if full != c and c not in self.space and full in self.space:
                c = full
            self.measured[c] = min(t, self.measured.get(c, math.inf))

    def propose(self, n: int, model: CostModel) -> list[Config]:
        n_random = max(1, round(n * self.opts.epsilon)) if n > 1 else 0
        if model.trained:  # the shared model may already know other tasks: then use it
            ranked = self._evolve(model)
        else:
            ranked = self._by_estimate()
            if ranked is None:  # no analytic estimate for this device: explore at random
                return self._random(n, set())
        chosen = [c for c in ranked if c not in self.measured][: n - n_random]
        return chosen + self._random(n - len(chosen), set(chosen))

    @property
    def _estimating(self) -> bool:
        """Whether the analytic estimate guides this search (a backend that has one)."""
        return self.has_estimate and self.opts.estimate_trials > 0

    def sample(self, n: int) -> list[Config]:
        """n distinct random configs not measured yet (the unguided baseline's proposals)."""
        return self._random(n, set())

    def _random(self, n: int, taken: set) -> list[Config]:
        out: list[Config] = []
        for _ in range(max(50, 20 * n)):
            if len(out) == n:
                break
            c = self.space.sample(self.rng)
            if c not in self.measured and c not in taken:
                taken.add(c)
                out.append(c)
        return out

    def _by_estimate(self) -> list[Config] | None:
        """A random pool ranked by estimated cycles, fewest first; None without one."""
        if not self._estimating:
            return None
        pool = self._random(self.opts.population + self.opts.fresh, set())
        _, cost = self.analyze(self.task.compute, pool, features=False)
        order = np.argsort(cost, kind="stable")
        return [pool[i] for i in order]

    def _evolve(self, model: CostModel) -> list[Config]:
        ranked_measured = sorted((c for c, t in self.measured.items() if math.isfinite(t)),
                                 key=self.measured.get)
        pop = ranked_measured[: self.opts.elite]
        pop += [self.space.sample(self.rng) for _ in range(self.opts.population - len(pop))]
        scores: dict[Config, tuple[float, float]] = {}
        for _ in range(self.opts.generations):
            children = [self._child(pop) for _ in range(self.opts.population)]
            self._score(children + pop, model, scores)
            pop = self._ranked(list(dict.fromkeys(pop + children)), scores)
            pop = pop[: self.opts.population]
        self._score(self._random(self.opts.fresh, set(scores)), model, scores)
        return self._ranked(list(scores), scores)

    def _ranked(self, cfgs: list[Config], scores: dict) -> list[Config]:
        """Best first, by the model's rank among `cfgs` blended with the estimate's. The
        model's weight grows with this task's own measurements n, as (n + 4) / (n + 4 +
        estimate_trials): a model trained on other tasks' records knows their good configs,
        not this one's, while the estimate knows every task equally little (and is absent
        off the CPU). The model always keeps some weight: the estimate ignores loop order
        and layout, and evolution under the estimate alone runs into what it ignores."""
        model_rank = _fractional_ranks([scores[c][0] for c in cfgs])
        if not self._estimating:
            key = model_rank
        else:
            own = sum(math.isfinite(t) for t in self.measured.values())
            w = (own + 4) / (own + 4 + self.opts.estimate_trials)
            key = w * model_rank + (1 - w) * _fractional_ranks([scores[c][1] for c in cfgs])
        order = np.argsort(-key, kind="stable")
        return [cfgs[i] for i in order]

    def _child(self, pop: list[Config]) -> Config:
        a = self.rng.choice(pop)
        if self.rng.random() < 0.3 and len(pop) > 1:
            a = self.space.crossover(a, self.rng.choice(pop), self.rng)
        return self.space.mutate(a, self.rng)

    def _score(self, cfgs: list[Config], model: CostModel, scores: dict) -> None:
        """(model score, fewer estimated cycles is higher) of every config not scored yet."""
        new = [c for c in dict.fromkeys(cfgs) if c not in scores]
        if not new:
            return
        x, cost = self.analyze(self.task.compute, new)  # one lowering serves both
        estimates = -cost if self._estimating else np.zeros(len(new))
        for c, s, e in zip(new, model.predict(x), estimates):
            scores[c] = (float(s), float(e))


def _fractional_ranks(values: list[float]) -> np.ndarray:
    """Rank of each value in [0, 1] (ties share their mean rank), highest value 1."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return np.ones(len(v))
    ranks = np.empty(len(v))
    ranks[np.argsort(v, kind="stable")] = np.arange(len(v))
    _, tie, counts = np.unique(v, return_inverse=True, return_counts=True)
    return (np.bincount(tie, ranks) / counts)[tie] / (len(v) - 1)
