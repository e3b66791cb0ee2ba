"""Configs, the points of a schedule space, and the spaces themselves: a Space of coupled
and independent knobs, a UnionSpace of alternatives (algorithms) with a space each.

The rules that generate a task's space belong to its backend: cpu/contraction_space.py and
cpu/schedules.py for the CPU, cuda/render.py for CUDA.
"""
from __future__ import annotations

import functools
import itertools
import math
import random
from dataclasses import dataclass
from typing import Any, Iterable, Iterator


@dataclass(frozen=True)
class Config:
    """A point of a schedule space: knob name -> value, as sorted pairs."""

    knobs: tuple[tuple[str, Any], ...]

    def __getitem__(self, name: str) -> Any:
        knobs = self._map()
        if name not in knobs:
            raise KeyError(f"config has no knob {name!r} (it has {sorted(knobs)})")
        return knobs[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._map().get(name, default)

    def _map(self) -> dict[str, Any]:
        """The knobs as a dict, made once (lowering a config reads its knobs dozens of
        times, and a search lowers thousands of configs per proposal)."""
        knobs = self.__dict__.get("_knob_map")
        if knobs is None:
            knobs = dict(self.knobs)
            object.__setattr__(self, "_knob_map", knobs)
        return knobs

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.knobs}

    @classmethod
    def from_json(cls, d: dict) -> "Config":
        return cls(tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                for k, v in d.items())))

    @classmethod
    def of(cls, **knobs: Any) -> "Config":
        return cls(tuple(sorted(knobs.items())))


@dataclass(frozen=True)
class Space:
    """Coupled knobs (listed jointly, as the valid combinations) times independent knobs."""

    coupled_names: tuple[str, ...]
    coupled: tuple[tuple, ...]
    independent: tuple[tuple[str, tuple], ...]

    def count(self) -> int:
        return len(self.coupled) * math.prod(len(c) for _, c in self.independent)

    @property
    def names(self) -> frozenset[str]:
        """Every knob a config of this space sets."""
        return frozenset(self.coupled_names) | {n for n, _ in self.independent}

    def __iter__(self) -> Iterator[Config]:
        names = self.coupled_names + tuple(n for n, _ in self.independent)
        for combo in self.coupled:
            for rest in itertools.product(*(c for _, c in self.independent)):
                yield Config(tuple(sorted(zip(names, combo + rest))))

    def _make(self, combo: tuple, rest: dict) -> Config:
        return Config(tuple(sorted({**dict(zip(self.coupled_names, combo)), **rest}.items())))

    def sample(self, rng: random.Random) -> Config:
        rest = {n: rng.choice(c) for n, c in self.independent}
        return self._make(rng.choice(self.coupled), rest)

    def mutate(self, cfg: Config, rng: random.Random) -> Config:
        """Change one knob to another value that keeps the point valid."""
        names = list(self.coupled_names) + [n for n, c in self.independent if len(c) > 1]
        name = rng.choice(names)
        current = dict(cfg.knobs)
        rest = {n: current[n] for n, _ in self.independent}
        combo = tuple(current[n] for n in self.coupled_names)
        if name in self.coupled_names:
            i = self.coupled_names.index(name)
            near = [c for c in self._neighbours[i].get(combo[:i] + combo[i + 1:], ())
                    if c[i] != combo[i]]
            combo = rng.choice(near) if near else rng.choice(self.coupled)
        else:
            choices = [v for v in dict(self.independent)[name] if v != current[name]]
            rest[name] = rng.choice(choices)
        return self._make(combo, rest)

    def prepare(self) -> None:
        """Build now the tables mutation reads (built on first use otherwise, then kept)."""
        self._neighbours  # noqa: B018 (a cached property: reading it builds it)

    @functools.cached_property
    def _neighbours(self) -> list[dict[tuple, list[tuple]]]:
        """Per coupled knob i: the combos grouped by their other knobs, in space order, so
        that a mutation finds the combos differing from it in knob i alone without a scan
        of the whole space (GEMM spaces hold thousands of combos)."""
        groups: list[dict[tuple, list[tuple]]] = [{} for _ in self.coupled_names]
        for c in self.coupled:
            for i, g in enumerate(groups):
                g.setdefault(c[:i] + c[i + 1:], []).append(c)
        return groups

    def crossover(self, a: Config, b: Config, rng: random.Random) -> Config:
        """A child taking the coupled knobs from one parent (as a block, so it stays valid)
        and each independent knob from either."""
        da, db = dict(a.knobs), dict(b.knobs)
        combo_from = da if rng.random() < 0.5 else db
        combo = tuple(combo_from[n] for n in self.coupled_names)
        rest = {n: (da if rng.random() < 0.5 else db)[n] for n, _ in self.independent}
        return self._make(combo, rest)

    def __contains__(self, cfg: Config) -> bool:
        d = dict(cfg.knobs)
        combo = tuple(d.get(n) for n in self.coupled_names)
        return combo in self._coupled_set and all(d.get(n) in c for n, c in self.independent) \
            and len(d) == len(self.coupled_names) + len(self.independent)

    @functools.cached_property
    def _coupled_set(self) -> frozenset:
        return frozenset(self.coupled)


# Knobs added to a space after records were written, with the value that kernel had then:
# an older record that lacks one is the config with it (see completed()).
KNOB_DEFAULTS = {
    "out_layout": "blocked",  # windows were blocked before they had the knob
    "split": 1,  # FFMA GEMMs on a GPU walked the whole reduction before split-K
    "chunk": 0,  # AMX GEMMs on a CPU walked the whole reduction before chunks
    "prefetch_b": 0,  # CPU outer-product kernels left B to the hardware before prefetch_b
}


def completed(cfg: Config, space: "Space | UnionSpace") -> Config:
    """`cfg` with every knob of KNOB_DEFAULTS that `space` has and cfg lacks set to that
    default: of a union, the knobs of the part cfg names (another part's knob, an AMX
    conv's chunk on a direct conv's config, would leave it outside the space)."""
    have = dict(cfg.knobs)
    names = space.names
    if isinstance(space, UnionSpace) and have.get(space.key) in dict(space.parts):
        names = dict(space.parts)[have[space.key]].names
    missing = {k: v for k, v in KNOB_DEFAULTS.items() if k not in have and k in names}
    return Config(tuple(sorted({**missing, **have}.items()))) if missing else cfg


def tuned_before_knobs(configs: Iterable[tuple[str, Config]], spaces: dict
                       ) -> dict[str, set[str]]:
    """The tasks whose every config (task key, config) in today's space got there only by
    completed(): each was measured before a knob of KNOB_DEFAULTS joined the space, so the
    search never reached what that knob adds (an NHWC window, say). Task key -> the knobs
    its configs lack. Tasks without a space in `spaces` are left out."""
    older: dict[str, set[str]] = {}
    current: set[str] = set()
    for key, cfg in configs:
        space = spaces.get(key)
        if space is None:
            continue
        if cfg in space:
            current.add(key)
        elif (full := completed(cfg, space)) in space:
            older.setdefault(key, set()).update(set(dict(full.knobs)) - set(dict(cfg.knobs)))
    return {k: v for k, v in older.items() if k not in current}


def describe_tuned_before(tasks, older: dict[str, set[str]]) -> str | None:
    """One sentence naming the tasks of tuned_before_knobs (tasks: Task objects, in
    order), or None when there are none."""
    named = [t for t in tasks if t.key in older]
    if not named:
        return None
    knobs = sorted(set().union(*(older[t.key] for t in named)))
    return (f"{len(named)} task(s) hold only records written before the knob(s) "
            f"{', '.join(knobs)} joined their schedule space, so what those knobs add was "
            f"never tuned for them (first: {named[0].compute.describe()}, task "
            f"{named[0].key})")


@dataclass(frozen=True)
class UnionSpace:
    """Alternatives (algorithms) with a space each; a Config names its part under `key`.

    Sampling picks an algorithm uniformly, then a point of it: weighted by size, a small
    part (Winograd's few thousand points beside a direct conv's hundreds of thousands)
    would seldom be sampled, and a search would seldom learn where it wins. Mutation stays
    inside the part, and now and then jumps to another."""

    key: str
    parts: tuple[tuple[str, Space], ...]
    jump: float = 0.1

    def count(self) -> int:
        return sum(s.count() for _, s in self.parts)

    @property
    def names(self) -> frozenset[str]:
        """Every knob a config of some part sets, and the key."""
        return frozenset({self.key}).union(*(s.names for _, s in self.parts))

    def _tag(self, name: str, cfg: Config) -> Config:
        return Config(tuple(sorted(cfg.knobs + ((self.key, name),))))

    def _part(self, cfg: Config) -> tuple[str, Space, Config]:
        name = cfg[self.key]
        space = dict(self.parts)[name]
        return name, space, Config(tuple(kv for kv in cfg.knobs if kv[0] != self.key))

    def __iter__(self) -> Iterator[Config]:
        for name, space in self.parts:
            for cfg in space:
                yield self._tag(name, cfg)

    def sample(self, rng: random.Random) -> Config:
        name, space = rng.choice(self.parts)
        return self._tag(name, space.sample(rng))

    def prepare(self) -> None:
        """Build every part's mutation tables now."""
        for _, space in self.parts:
            space.prepare()

    def mutate(self, cfg: Config, rng: random.Random) -> Config:
        name, space, inner = self._part(cfg)
        if rng.random() < self.jump and len(self.parts) > 1:
            other = rng.choice([p for p in self.parts if p[0] != name])
            return self._tag(other[0], other[1].sample(rng))
        return self._tag(name, space.mutate(inner, rng))

    def crossover(self, a: Config, b: Config, rng: random.Random) -> Config:
        if a[self.key] != b[self.key]:
            return a if rng.random() < 0.5 else b
        name, space, ia = self._part(a)
        return self._tag(name, space.crossover(ia, self._part(b)[2], rng))

    def __contains__(self, cfg: Config) -> bool:
        if cfg.get(self.key) not in dict(self.parts):
            return False
        _, space, inner = self._part(cfg)
        return inner in space
