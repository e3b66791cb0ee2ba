"""One XGBoost ranking model over the records of all tasks.

Each task is a query group; within a group the label is the normalised throughput
(best time / time, so 1.0 for the task's best candidate, 0 for errors), and the objective
is pairwise ranking: what search needs is the order of candidates, and throughputs of
different tasks are not comparable. The booster travels as bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from raytune_kernels.space import Config
from raytune_kernels.tune.records import Record
from raytune_kernels.task import Compute, Task

Featurize = Callable[[Compute, Config], list[float]]  # a backend's features (backend.py)

PARAMS = {"objective": "rank:pairwise", "eta": 0.2, "max_depth": 6, "min_child_weight": 1,
          "subsample": 0.9, "lambda": 1.0, "verbosity": 0, "nthread": 1, "seed": 0}
ROUNDS = 60


@dataclass
class TrainingSet:
    features: list[list[float]] = field(default_factory=list)
    labels: list[float] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)  # sizes of consecutive query groups

    def __len__(self) -> int:
        return len(self.labels)


def training_set(tasks: dict[str, Task], records: Iterable[Record], featurize: Featurize,
                 cache: dict | None = None) -> TrainingSet:
    """Features and normalised-throughput labels of every record of a known task.
    `cache` keeps each (task, config)'s features across calls: retraining every round
    must not featurize the whole history again."""
    cache = {} if cache is None else cache
    by_task: dict[str, list[Record]] = {}
    for r in records:
        if r.task_key in tasks:
            by_task.setdefault(r.task_key, []).append(r)
    out = TrainingSet()
    for key, recs in by_task.items():
        best = min(r.median for r in recs)
        rows = []
        for r in recs:
            x = _features(tasks[key], r, featurize, cache)
            if x is not None:
                rows.append((x, best / r.median if r.ok and math.isfinite(best) else 0.0))
        if len(rows) >= 2:
            out.features += [x for x, _ in rows]
            out.labels += [y for _, y in rows]
            out.groups.append(len(rows))
    return out


def _features(task: Task, r: Record, featurize: Featurize, cache: dict) -> list[float] | None:
    key = (task.key, r.config_key())
    if key not in cache:
        try:
            cache[key] = featurize(task.compute, Config.from_json(r.config))
        except Exception:  # a record from an older space that no longer lowers
            cache[key] = None
    return cache[key]


class CostModel:
    """Ranks candidates; untrained, it predicts zeros (search then explores at random)."""

    def __init__(self, booster: bytes | None = None):
        self._booster = None
        if booster:
            self.load(booster)

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def fit(self, data: TrainingSet) -> bool:
        """Train on `data`; returns False (and keeps the old model) when it is too small."""
        if len(data) < 8 or len(data.groups) == 0:
            return False
        import xgboost as xgb

        d = xgb.DMatrix(np.asarray(data.features, np.float32),
                        label=np.asarray(data.labels, np.float32))
        d.set_group(data.groups)
        self._booster = xgb.train(PARAMS, d, num_boost_round=ROUNDS)
        return True

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self._booster is None or len(features) == 0:
            return np.zeros(len(features), np.float32)
        import xgboost as xgb

        return self._booster.predict(xgb.DMatrix(np.asarray(features, np.float32)))

    def save(self) -> bytes | None:
        return None if self._booster is None else bytes(self._booster.save_raw("ubj"))

    def load(self, raw: bytes) -> None:
        import xgboost as xgb

        booster = xgb.Booster(params={"nthread": 1})
        booster.load_model(bytearray(raw))
        self._booster = booster
