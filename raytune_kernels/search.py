"""Evolutionary search, ask/tell: propose(n) configs, observe(results).

The population is seeded from the best measured configs and random samples, evolved by
mutation and crossover for a few generations, and ranked by the cost model; a fraction
epsilon of every batch is random, so the model never blinds the search. A config already
measured for the task (errors included) is never proposed again.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .codegen.build import CpuInfo
from .codegen.space import Config
from .cost_model import CostModel
from .features import feature_matrix
from .task import Task


@dataclass(frozen=True)
class SearchOptions:
    population: int = 96
    generations: int = 3
    elite: int = 12
    epsilon: float = 0.15


class EvolutionarySearch:
    def __init__(self, task: Task, space, cpu: CpuInfo, seed: int = 0,
                 opts: SearchOptions = SearchOptions()):
        self.task, self.space, self.cpu, self.opts = task, space, cpu, opts
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
        for c, t in zip(cfgs, seconds):
            self.measured[c] = min(t, self.measured.get(c, math.inf))

    def propose(self, n: int, model: CostModel) -> list[Config]:
        if not model.trained:  # the shared model may already know other tasks: then use it
            return self._random(n, set())
        n_random = max(1, round(n * self.opts.epsilon)) if n > 1 else 0
        ranked = self._evolve(model)
        chosen = [c for c in ranked if c not in self.measured][: n - n_random]
        return chosen + self._random(n - len(chosen), set(chosen))

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

    def _evolve(self, model: CostModel) -> list[Config]:
        ranked_measured = sorted((c for c, t in self.measured.items() if math.isfinite(t)),
                                 key=self.measured.get)
        pop = ranked_measured[: self.opts.elite]
        pop += [self.space.sample(self.rng) for _ in range(self.opts.population - len(pop))]
        scores: dict[Config, float] = {}
        for _ in range(self.opts.generations):
            children = [self._child(pop) for _ in range(self.opts.population)]
            self._score(children + pop, model, scores)
            pool = sorted(dict.fromkeys(pop + children), key=lambda c: -scores[c])  # stable order
            pop = pool[: self.opts.population]
        return sorted(scores, key=lambda c: -scores[c])

    def _child(self, pop: list[Config]) -> Config:
        a = self.rng.choice(pop)
        if self.rng.random() < 0.3 and len(pop) > 1:
            a = self.space.crossover(a, self.rng.choice(pop), self.rng)
        return self.space.mutate(a, self.rng)

    def _score(self, cfgs: list[Config], model: CostModel, scores: dict) -> None:
        new = [c for c in dict.fromkeys(cfgs) if c not in scores]
        if new:
            for c, s in zip(new, model.predict(feature_matrix(self.task.compute, new, self.cpu))):
                scores[c] = float(s)
