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
# Retrain once the records grew by this fraction since the model was last trained (and by
# one record at least): every round while they are few, every few rounds later, so that
# learning costs about the same per trial at any history length (a training costs in
# proportion to the records it learns from).
REFIT_GROWTH = 0.25


def refit_due(records: int, trained_on: int, growth: float = REFIT_GROWTH) -> bool:
    """Whether `records` records are enough more than the `trained_on` of the last
    training to train again."""
    return records - trained_on >= max(1.0, growth * trained_on)


@dataclass
class TrainingSet:
    features: list[list[float]] = field(default_factory=list)
    labels: list[float] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)  # sizes of consecutive query groups
    keys: list[str] = field(default_factory=list)  # the task of each group

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
            out.keys.append(key)
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
        self.version = 0  # counts trainings and loads: scores of an older one are stale
        self.trained_on = 0  # records the latest training learnt from
        self.learnt: dict[str, int] = {}  # task key -> its records in that training
        if booster:
            self.load(booster)

    @property
    def trained(self) -> bool:
        return self._booster is not None

    @property
    def identity(self) -> tuple[int, int]:
        """Equal between two calls only if the model predicts the same in both."""
        return id(self), self.version

    def refit(self, records: int, data: Callable[[], TrainingSet]) -> bool:
        """Train on `data()`, the training set of `records` records, when refit_due says
        they grew enough since the last training; returns whether it trained."""
        if not refit_due(records, self.trained_on) or not self.fit(data()):
            return False
        self.trained_on = records
        return True

    def fit(self, data: TrainingSet) -> bool:
        """Train on `data`; returns False (and keeps the old model) when it is too small."""
        if len(data) < 8 or len(data.groups) == 0:
            return False
        import xgboost as xgb

        # one thread, as training: XGBoost's default (every core) spends ~20 ms per
        # DMatrix starting threads, more than the training of a few hundred records
        d = xgb.DMatrix(np.asarray(data.features, np.float32),
                        label=np.asarray(data.labels, np.float32), nthread=1)
        d.set_group(data.groups)
        self._booster = xgb.train(PARAMS, d, num_boost_round=ROUNDS)
        self.learnt = dict(zip(data.keys, data.groups))
        self.version += 1
        return True

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Scores of feature rows, higher for faster: one batch, no DMatrix (building
        one costs more than predicting a search's few hundred rows)."""
        if self._booster is None or len(features) == 0:
            return np.zeros(len(features), np.float32)
        return self._booster.inplace_predict(np.asarray(features, np.float32))

    def save(self) -> bytes | None:
        return None if self._booster is None else bytes(self._booster.save_raw("ubj"))

    def state(self) -> tuple[bytes, dict[str, int]] | None:
        """The booster and what it learnt per task: what another process's copy loads."""
        return None if self._booster is None else (self.save(), dict(self.learnt))

    def load_state(self, state: tuple[bytes, dict[str, int]]) -> None:
        raw, self.learnt = state[0], dict(state[1])
        self.load(raw)

    def load(self, raw: bytes) -> None:
        import xgboost as xgb

        booster = xgb.Booster(params={"nthread": 1})
        booster.load_model(bytearray(raw))
        self._booster = booster
        self.version += 1
