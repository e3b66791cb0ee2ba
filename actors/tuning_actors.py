"""Tuning actors: a cost model, search actors and the task scheduler, thin over the core.

The cost model actor retrains as records arrive and returns the booster as bytes: the
returned value lives in Ray's object store, and search actors fetch it from there to
predict locally. The task scheduler actor runs the core Tuner, the single writer of
records, one round per call, and hands each round's summary and records to the driver
(for its callbacks).
"""
from __future__ import annotations

import dataclasses
import math
import os

import ray

from raytune_kernels.backend import Backend, backend_for, platform_for
from raytune_kernels.cuda.gpu import ArchMismatchError, check_measurable, gpu_info
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.placement import SEARCH_RESOURCE
from raytune_kernels.space import Config
from raytune_kernels.tune.cost_model import CostModel, training_set
from raytune_kernels.tune.records import Record, RecordWriter
from raytune_kernels.tune.search import EvolutionarySearch, SearchOptions, seeds_unmeasured
from raytune_kernels.target import parse_target
from raytune_kernels.task import Task
from raytune_kernels.tune.request import TuneRequest
from raytune_kernels.tune.tuner import RoundSummary, Tuner

from actors.measure_actors import pin_cores
from actors.metrics import TuningMetrics


# The scheduler and cost model live on the head node (measurers on the workers).
ON_HEAD = {"resources": {"node:__internal_head__": 0.001}}
MAX_SEARCH_ACTORS = 8  # the default on a cluster: one per node up to this many


@ray.remote(num_cpus=0)
class CostModelActor:
    """The target's `backend` gives the features."""

    def __init__(self, tasks: list[dict], backend: Backend):
        self.tasks = {t["key"]: Task.from_json(t) for t in tasks}
        self.backend, self.model, self.records, self.features = backend, CostModel(), [], {}

    def pin(self, cores: tuple[int, ...]) -> None:
        _pin_niced(cores)

    def pid(self) -> int:
        return os.getpid()

    def learn(self, records: list[dict]) -> tuple | None:
        """Add `records`; the model's state (booster, records learnt per task) when it was
        retrained (cost_model.refit_due), else None (search actors keep the one they have)."""
        self.records += [Record.from_json(r) for r in records]
        if not self.model.refit(len(self.records), lambda: training_set(
                self.tasks, self.records, self.backend.featurize, self.features)):
            return None
        return self.model.state()

    def booster(self) -> bytes | None:
        """The latest booster (None before the first training)."""
        return self.model.save()

    def state(self) -> tuple | None:
        """The model's latest state (CostModel.state; None before the first training)."""
        return self.model.state()


@ray.remote(num_cpus=0)
class SearchActor:
    """Evolutionary searches for a group of tasks, predicting with a local booster copy.
    The target's `backend` gives the spaces, features and estimate."""

    def __init__(self, tasks: list[dict], backend: Backend, seed: int, opts: SearchOptions):
        self.searches = {}
        for d in tasks:
            t = Task.from_json(d)
            self.searches[t.key] = EvolutionarySearch(t, backend.space(t.compute), backend,
                                                      seed, opts)
        self.model = CostModel()

    def refresh(self, state: tuple | None) -> None:
        """The cost model's latest state (CostModel.state), when it retrained."""
        if state:
            self.model.load_state(state)

    def pin(self, cores: tuple[int, ...]) -> None:
        _pin_niced(cores)

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def prepare(self) -> None:
        """Every search's initial pool analysed ahead of the rounds (search.prepare)."""
        for search in self.searches.values():
            search.prepare(self.model)

    def propose(self, key: str, n: int) -> list[dict]:
        return [c.to_json() for c in self.searches[key].propose(n, self.model)]

    def measured(self, key: str) -> int:
        """How many distinct configs task `key`'s search knows as measured."""
        return len(self.searches[key].measured)

    def observe(self, key: str, cfgs: list[dict], seconds: list[float]) -> bool:
        s = self.searches[key]
        s.observe([Config.from_json(c) for c in cfgs], seconds)
        return s.exhausted


class RaySearchPool:
    """The SearchPool of the core Tuner, backed by search actors and the cost model actor.
    A search actor lost with its node is started again on a node alive, and told what its
    tasks measured so far (and the model's latest state) before it proposes again."""

    def __init__(self, tasks: list[Task], backend: Backend, seed: int,
                 opts: SearchOptions, num_search: int = 1, spread: bool = False):
        """`num_search` actors share the tasks, dealt in turn. `Tuner.step` asks for one
        batch at a time, so there more than one only adds a process to start (torch and
        the package imported: ~4 s of CPU each on 2 cores); `Tuner.streamed` asks for
        several at once (propose_many), which the actors make in parallel. They sit on
        the head, or with `spread`, dealt over the nodes (search_placement); each keeps a
        copy of the cost model's latest booster, fetched from the object store."""
        self.groups = [tasks[i::num_search] for i in range(min(num_search, len(tasks)))]
        self.tasks = {t.key: t for t in tasks}
        self._args, self.spread = (backend, seed, opts), spread
        where = search_placement(len(self.groups)) if spread else [ON_HEAD] * len(self.groups)
        self.actors = [self._start(g, w) for g, w in zip(self.groups, where)]
        self.group_of = {t.key: k for k, g in enumerate(self.groups) for t in g}
        self.model = CostModelActor.options(**ON_HEAD).remote([t.to_json() for t in tasks],
                                                              backend)
        self._exhausted: set[str] = set()
        self._seen: dict[str, tuple[list[dict], list[float]]] = {}  # what each task measured
        self.restarts = 0

    def _start(self, group: list[Task], where: dict):
        return SearchActor.options(**where).remote([t.to_json() for t in group], *self._args)

    @property
    def owner(self) -> dict:
        """Task key -> its search actor."""
        return {key: self.actors[k] for key, k in self.group_of.items()}

    def _call(self, k: int, method: str, *args):
        """Search actor `k`'s `method`; one that died with its node (or was killed) is
        replaced once and asked again."""
        return self._get(k, getattr(self.actors[k], method).remote(*args), method, *args)

    def _get(self, k: int, ref, method: str, *args):
        """The value of `ref`, a call of search actor `k`'s `method` with `args`; where
        the actor died, its replacement's answer to the same call."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError:
            self._replace(k)
            return ray.get(getattr(self.actors[k], method).remote(*args))

    def _replace(self, k: int) -> None:
        where = search_placement(k + 1)[k] if self.spread else ON_HEAD
        actor = self._start(self.groups[k], where)
        for t in self.groups[k]:
            if t.key in self._seen:
                ray.get(actor.observe.remote(t.key, *self._seen[t.key]))
        ray.get(actor.refresh.remote(self.model.state.remote()))
        self.actors[k] = actor
        self.restarts += 1

    def propose(self, key: str, n: int) -> list[Config]:
        return [Config.from_json(c) for c in self._call(self.group_of[key], "propose", key, n)]

    def propose_many(self, asks: list[tuple[str, int]]) -> list[list[Config]]:
        """One proposal per (task key, n), each by its task's search actor: actors work
        in parallel (a task's rounds in turn, on its one actor)."""
        refs = [self.actors[self.group_of[key]].propose.remote(key, n) for key, n in asks]
        return [[Config.from_json(c) for c in self._get(self.group_of[key], ref, "propose",
                                                        key, n)]
                for (key, n), ref in zip(asks, refs)]

    def observe(self, key: str, cfgs: list[Config], seconds: list[float]) -> None:
        js = [c.to_json() for c in cfgs]
        done = self._call(self.group_of[key], "observe", key, js, seconds)
        seen = self._seen.setdefault(key, ([], []))  # after the call: a replacement it
        seen[0].extend(js)                            # needed is told these by the call
        seen[1].extend(seconds)
        if done:
            self._exhausted.add(key)

    def learn(self, records: list[Record]) -> None:
        state = self.model.learn.remote([r.to_json() for r in records])  # an ObjectRef
        refs = [a.refresh.remote(state) for a in self.actors]  # in parallel
        for k, ref in enumerate(refs):
            self._get(k, ref, "refresh", state)

    def unseeded(self, key: str, measured: list[Config]) -> bool:
        return seeds_unmeasured(self._args[0], self.tasks[key], measured)

    def exhausted(self, key: str) -> bool:
        return key in self._exhausted

    def prepare(self) -> None:
        """Every search actor prepares its searches, in parallel (search.prepare)."""
        refs = [a.prepare.remote() for a in self.actors]
        for k, ref in enumerate(refs):
            self._get(k, ref, "prepare")

    def nodes(self) -> list[str | None]:
        """The node of each search actor (None for one that is gone)."""
        out = []
        for ref in [a.node.remote() for a in self.actors]:
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError:
                out.append(None)
        return out

    def pids(self) -> list[int]:
        """The processes of the search actors and the cost model actor."""
        return ray.get([a.pid.remote() for a in self.actors + [self.model]])

    def pin(self, cores: tuple[int, ...]) -> None:
        """Keep the search and cost model processes on `cores` (off the measurers'), at
        the lowest priority: a proposal made beside a round then takes the CPU its builds
        leave (phased builds use every core, and then the measurer alone times them)."""
        ray.get([a.pin.remote(tuple(cores)) for a in self.actors + [self.model]])


@ray.remote(num_cpus=0)
class TaskSchedulerActor:
    """Runs the Tuner: owns the budget, the scheduler, the measuring pipeline and the
    records writer (the single writer)."""

    def __init__(self, request: TuneRequest, history: list[dict]):
        """`request.device` and `request.isa` name the measuring CPU of an llvm target,
        `request.cpu` describes the CPU code is built for. On a cuda target they are None:
        the measuring GPU tells its name and arch, and the records' target gains the arch
        ("cuda" -> "cuda -arch=sm_90"). `request.torch_s`, the network's PyTorch part,
        joins the estimate in the dashboard metrics (actors/metrics.py), recorded after
        every round. `history`: the records resumed, as JSON."""
        tasks, target, device = list(request.tasks), request.target, request.device
        self.problem: Exception | None = None
        self.metrics = TuningMetrics(request.torch_s)
        on_gpu = platform_for(target).on_gpu
        opts, measure_opts = request.tune_options(), request.measure_options(on_gpu)
        # the search and cost model actors start while the pipeline below waits for its
        # measurers (a cuda target's backend needs the measuring GPU's arch first)
        searchers = search_actors(request.search_actors, len(tasks))
        spread = searchers > 1
        pool = None if on_gpu else RaySearchPool(tasks, backend_for(target, request.cpu,
                                                             opts.threads),
                                                 opts.seed, opts.search, searchers, spread)
        if on_gpu:
            self.pipeline, target, device, info = _gpu_pipeline(target, measure_opts)
            try:
                check_measurable(self.pipeline.gpu_arch(), self.pipeline.gpu_archs())
            except ArchMismatchError as exc:  # raised to the driver by the first call
                self.problem = exc
                return
        else:
            self.pipeline, info = _cpu_pipeline(request, measure_opts), request.cpu
        self.writer = RecordWriter(request.records) if request.records else None
        pool = pool or RaySearchPool(tasks, backend_for(target, info), opts.seed, opts.search,
                                     searchers, spread)
        opts = dataclasses.replace(opts, overlap=_overlap(self.pipeline, pool))
        self.tuner = Tuner(tasks, target, device, self.pipeline.run, pool, self.writer,
                           [Record.from_json(r) for r in history], opts, request.isa)
        self.pool = pool
        # Where builders have cores of their own, rounds stream: every measurer takes the
        # next built candidate while later rounds are proposed and built (Tuner.streamed),
        # about two candidates in flight per measurer. Else one round at a time (step).
        self._rounds = None if self.pipeline.phased else self.tuner.streamed(
            self.pipeline.launch, self.pipeline.wait,
            lambda: max(2, math.ceil(2 * len(self.pipeline.slots) / opts.batch)))

    def initial(self) -> RoundSummary:
        """The table before any round; raises what made the run impossible, if anything."""
        if self.problem:
            raise self.problem
        summary = self.tuner.initial()
        self.metrics.observe(summary, [], self.pipeline.stats)
        return summary

    def step(self) -> tuple[RoundSummary, list[Record]] | None:
        """One round: its summary and its records (already written); None at the end."""
        summary = self.tuner.step() if self._rounds is None else next(self._rounds, None)
        if summary is None:
            return None
        self.metrics.observe(summary, self.tuner.last, self.pipeline.stats)
        return summary, self.tuner.last

    def other_devices(self) -> dict[str, int]:
        """Records of this target in the history that another device measured (skipped)."""
        return self.tuner.other_devices if hasattr(self, "tuner") else {}

    def setup(self) -> dict:
        """How the run is laid out (TuningResult.setup)."""
        return {"measurers": len(self.pipeline.slots),
                "nodes": len(getattr(self.pipeline, "nodes", ())) or 1,
                "streamed": self._rounds is not None, "search_nodes": self.pool.nodes(),
                "search_restarts": self.pool.restarts}

    def flush(self) -> None:
        """Make the records written so far durable (RecordWriter.flush) and record the
        metrics held back: before the driver ends this actor early."""
        if getattr(self, "writer", None):
            self.writer.flush()
        self.metrics.flush()

    def result(self):
        self.metrics.flush()
        if self.writer:
            self.writer.close()
        self.pipeline.shutdown()
        return self.tuner.result()


def search_actors(asked: int | None, tasks: int) -> int:
    """How many search actors: `asked`, else one per alive node up to MAX_SEARCH_ACTORS
    (one on a single machine); never more than there are tasks."""
    n = asked or min(MAX_SEARCH_ACTORS, sum(1 for n in ray.nodes() if n["Alive"]))
    return max(1, min(n, tasks))


def search_placement(count: int) -> list[dict]:
    """Ray options for `count` search actors dealt over the nodes in turn: the nodes that
    offer SEARCH_RESOURCE when any alive node does, else every node, the head first; an
    actor whose node is gone is replaced by RaySearchPool. (Ray's SPREAD strategy, and its
    soft node affinity, put actors that reserve no CPU wherever it liked.)"""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = [n for n in ray.nodes() if n["Alive"]]
    alive.sort(key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeID"]))
    search = [n for n in alive if n["Resources"].get(SEARCH_RESOURCE)]
    nodes = [n["NodeID"] for n in search or alive]
    return [{"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[k % len(nodes)],
                                                                   soft=False)}
            for k in range(count)]


def _overlap(pipeline, pool: RaySearchPool) -> bool:
    """Whether the Tuner may propose while it measures (TuneOptions.overlap): yes where
    the measurers are GPUs or other nodes' cores; on this machine's cores, once the
    search and cost model are pinned to the cores no measurer owns (none: no overlap)."""
    owned = [c for s in pipeline.slots if s.cores is not None for c in s.cores]
    if getattr(pipeline, "device", "cpu") == "gpu" or not owned:
        return True
    free = tuple(sorted(set(os.sched_getaffinity(0)) - set(owned)))
    if free:
        pool.pin(free)
    return bool(free)


def _pin_niced(cores: tuple[int, ...]) -> None:
    """This process on `cores`, niced to the lowest priority (RaySearchPool.pin)."""
    pin_cores(cores)
    if hasattr(os, "nice"):
        os.nice(19 - os.nice(0))


def _cpu_pipeline(request: TuneRequest, measure_opts: MeasureOptions):
    """CPU measurers owning `threads` cores each: on every node of a cluster, placed by
    the rules, or on this machine's cores."""
    from actors.pipeline import MeasurePipeline

    mcpu = parse_target(request.target).mcpu
    if request.cluster:
        return MeasurePipeline.on_cluster(measure_opts, request.threads, mcpu,
                                          measurers_per_node=request.num_measurers)
    return MeasurePipeline(request.num_measurers or 1, request.num_builders, measure_opts,
                           cores_per_measurer=request.threads, mcpu=mcpu)


def _gpu_pipeline(target: str, measure_opts):
    """One measurer per GPU and NVRTC builders on the CPUs left, placed by the same rules
    on one machine as on a cluster. Returns the pipeline, the target with the arch built
    for, the measuring GPU's name and its figures for the cost model."""
    from actors.pipeline import MeasurePipeline

    pipeline = MeasurePipeline.on_cluster(measure_opts, device="gpu",
                                          arch=parse_target(target).arch)
    arch = pipeline.gpu_arch()
    target = str(dataclasses.replace(parse_target(target), arch=arch))  # the precision stays
    return pipeline, target, pipeline.gpu_name(), gpu_info(arch)
