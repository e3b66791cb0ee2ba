"""The measuring pipeline on Ray: builders work ahead while measurers stay busy.

Cores: each measurer owns `cores_per_measurer` cores (its process's affinity); builders
get the cores no measurer owns. When none are left (2 measurers on 2 cores), builds and
measurements alternate by batch instead, so that no build ever shares a core with a
measurement in flight. A measurer that dies is restarted by Ray and its candidate measured
again; a candidate that kills it twice (segfault) is recorded as `crashed`. A candidate that
runs past its timeout gets its measurer killed and replaced by a fresh one (never reused)
and is recorded as `timeout`. A builder that dies, or whose build runs past the build
timeout, is replaced by a fresh actor and its other builds are submitted again. A
candidate that fails for the machine's sake (a full temp directory) is tried again after
growing waits, then recorded as `host_error`; a batch of nothing else stops the run
(HostFault).

On a cluster (`MeasurePipeline.on_cluster`), actors are placed by raytune_kernels.placement:
measurers pinned to core blocks (or one per GPU) on worker nodes, builders on the CPUs left.
Before each batch the pipeline re-reads the live nodes: a node that joined gets its
measurers and builders, a node that left is dropped. A measurer or build lost with its node
is not a crash: the candidate is built or measured again elsewhere, so a lost node costs
only its trials in flight, and only their time.
"""
from __future__ import annotations

import itertools
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Iterable

import ray
from ray.exceptions import RayError

from raytune_kernels.cpu.build import BUILD_PHASES, BuildResult
from raytune_kernels.space import Config
from raytune_kernels.measure import (BUILD_ERROR, CRASHED, HOST_ERROR, MEASURE_PHASES, TIMEOUT,
                                     MeasureOptions, MeasureResult)
from raytune_kernels.placement import SEARCH_RESOURCE, NodeInfo, phased, plan
from raytune_kernels.task import Task

from actors.measure_actors import BuilderActor, MeasurerActor


START_TIMEOUT_S = 120.0  # measurers that cannot be placed in this long will not be
HOST_RETRY_WAITS_S = (1.0, 4.0, 16.0)  # a full temp dir may be freed: try again after these
HOST_RETRY_LOG = "raytune_kernels host fault"
PHASES = BUILD_PHASES + ("queue",) + MEASURE_PHASES + ("call",)  # PipelineStats fields


class HostFault(RuntimeError):
    """Every candidate of a batch failed for the machine's sake (a full temp directory):
    tuning on would only record the same failure for every trial."""


@dataclass
class PipelineStats:
    measure_busy_s: float = 0.0  # summed over measurers
    wall_s: float = 0.0
    measurers: int = 1
    redone: int = 0  # builds and measurements lost with a node and done again elsewhere
    build_timeouts: int = 0  # builds past opts.build_timeout_s (their builders replaced)
    # Where the time of the trials went, summed over `timed_trials` (those measured, or
    # failing to build, without a crash or timeout): the builders' phases (BUILD_PHASES),
    # the measurers' (MEASURE_PHASES), and what Ray and the pipeline added between a
    # build's submission and its result: `queue_s` until a measurer took the candidate
    # (waiting for a builder and for a free measurer, less the build itself), `call_s`
    # of the measurer's call beyond its run (the library's and result's transfer).
    timed_trials: int = 0
    render_s: float = 0.0
    optimize_s: float = 0.0
    codegen_s: float = 0.0
    link_s: float = 0.0
    load_s: float = 0.0
    check_s: float = 0.0
    timing_s: float = 0.0
    queue_s: float = 0.0
    call_s: float = 0.0

    @property
    def idle_fraction(self) -> float:
        total = self.wall_s * self.measurers
        return 0.0 if total <= 0 else max(0.0, 1.0 - self.measure_busy_s / total)

    def add_phases(self, phases: Iterable[tuple[str, float]]) -> None:
        """Add (phase, seconds) pairs to the phase fields (unknown phases are dropped)."""
        for name, seconds in phases:
            if name in PHASES:
                setattr(self, f"{name}_s", getattr(self, f"{name}_s") + seconds)

    def phase_seconds(self) -> dict[str, float]:
        """Seconds per phase summed over the timed trials, in trial order."""
        return {name: getattr(self, f"{name}_s") for name in PHASES}


@dataclass
class _Slot:
    cores: tuple[int, ...] | None  # None: the measurer picks core block `block` on its node
    actor: object = None
    busy_since: float = 0.0
    node_id: str | None = None  # pinned to this node (cluster mode)
    block: tuple[int, int] = (0, 1)


def alive_nodes() -> list[NodeInfo]:
    return [NodeInfo(n["NodeID"], int(n["Resources"].get("CPU", 0)),
                     int(n["Resources"].get("GPU", 0)),
                     "node:__internal_head__" in n["Resources"],
                     bool(n["Resources"].get(SEARCH_RESOURCE)))
            for n in ray.nodes() if n["Alive"]]


NAMESPACE = "raytune_kernels"  # where the pipeline's named actors live
_RUN = uuid.uuid4().hex[:8]  # this process's pipelines
_serial = itertools.count()


def _named(role: str) -> dict:
    """Actor options naming it `<role>-<run>-<n>` in the raytune_kernels namespace: the
    dashboard lists it by role, and an operator (or bench/chaos.py) can find it with
    ray.util.list_named_actors(all_namespaces=True) and ray.get_actor(name, NAMESPACE)."""
    return {"name": f"{role}-{_RUN}-{next(_serial)}", "namespace": NAMESPACE}


def _maker(actor_class, role: str, *args, **options):
    """A callable starting a new `actor_class` actor with `options` and `args`, under a new
    name each call: a replacement cannot take its predecessor's name, which Ray frees only
    once the killed actor is gone."""
    def make():
        return actor_class.options(**options, **_named(role)).remote(*args)
    return make


def _on(node_id: str | None) -> dict:
    if node_id is None:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


class MeasurePipeline:
    """Builds and measures batches of (task, config); results come back in order. Or a
    stream of rounds: launch() and wait(), as Tuner.stream drives them."""

    _stream: dict | None = None  # handle -> the round's places, while a stream is open

    def __init__(self, num_measurers: int = 1, num_builders: int | None = None,
                 opts: MeasureOptions = MeasureOptions(), cores_per_measurer: int = 1,
                 mcpu: str | None = None, cores: tuple[int, ...] | None = None,
                 phased: bool | None = None):
        cores = tuple(sorted(cores or os.sched_getaffinity(0)))
        need = num_measurers * cores_per_measurer
        if need > len(cores):
            raise ValueError(f"{num_measurers} measurers x {cores_per_measurer} cores need "
                             f"{need} cores; this machine offers {len(cores)}")
        self.opts, self.mcpu = opts, mcpu
        self.slots = [_Slot(cores[i * cores_per_measurer:(i + 1) * cores_per_measurer])
                      for i in range(num_measurers)]
        spare = cores[need:]
        # Alternate builds and measurements by batch, builders on every core, when no core
        # is free of measurement, and also when the free cores are no more than the
        # measuring ones: a build costs several measurements (a ResNet-18 conv: 0.36 s
        # against 0.06 s), so one builder beside one measurer keeps it idle 84% of
        # the time (2.7 trials/s on 2 cores), where building on both cores, then measuring,
        # makes more trials per second (bench/scaling.py).
        self.phased = len(spare) <= need if phased is None else phased
        self.spare_cores = len(spare)  # cores no measurer owns
        if not self.phased and not spare:
            raise ValueError(f"builds beside measurements need a core no measurer owns: "
                             f"{num_measurers} measurer(s) x {cores_per_measurer} hold all "
                             f"{len(cores)}")
        builder_cores = cores if self.phased else spare
        n_builders = num_builders or max(1, len(builder_cores))
        # Ray's CPU accounting: measurers hold their cores, builders share the spare ones
        # (when phased, builders also run on the measurers' cores, between measurements)
        share = len(spare) / n_builders
        # how each builder is made, to replace one that died or ran past the build timeout
        self.builder_makers = [_maker(BuilderActor, "builder", builder_cores, num_cpus=share)
                               for _ in range(n_builders)]
        self.builders = [make() for make in self.builder_makers]
        self.builder_nodes: list[str | None] = [None] * n_builders
        self.cluster, self._turn = False, 0
        self._build_node: dict = {}  # build ObjectRef -> (its builder's node, the builder)
        for slot in self.slots:
            self._start(slot)
        try:
            ray.get([s.actor.ready.remote() for s in self.slots], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            free = ray.available_resources().get("CPU", 0)
            self.shutdown()
            raise RuntimeError(
                f"{num_measurers} measurer(s) of {cores_per_measurer} CPU(s) did not start "
                f"within {START_TIMEOUT_S:.0f} s: Ray has {free:g} CPU(s) free (another run "
                f"or pipeline in this Ray session may hold them)") from None
        self.stats = PipelineStats(measurers=num_measurers)

    @classmethod
    def on_cluster(cls, opts: MeasureOptions = MeasureOptions(), cores_per_measurer: int = 1,
                   mcpu: str | None = None, device: str = "cpu",
                   measurers_per_node: int | None = None, arch: str | None = None
                   ) -> "MeasurePipeline":
        """Measurers and builders on the nodes of the Ray cluster we are connected to,
        placed by raytune_kernels.placement and kept up to date as nodes come and go.
        device="gpu": one GPU measurer per GPU, CUDA builders (NVRTC) for `arch`, or for
        the first measurer's GPU when not given."""
        self = cls.__new__(cls)
        self.opts, self.mcpu, self.cluster, self._turn = opts, mcpu, True, 0
        self._build_node: dict = {}
        self.arch = arch
        self.device, self.cores_per_measurer = device, cores_per_measurer
        self.measurers_per_node = measurers_per_node
        self.slots, self.builders, self.builder_nodes = [], [], []
        self.builder_makers = []
        self.nodes: set[str] = set()
        self.stats = PipelineStats(measurers=0)
        self.refresh()
        return self

    def refresh(self) -> None:
        """Apply the placement to the nodes alive now: joiners get their actors, actors
        of nodes that left are dropped (their in-flight work is redone elsewhere)."""
        alive = alive_nodes()
        ids = {n.node_id for n in alive}
        self.slots = [s for s in self.slots if s.node_id in ids]
        keep = [i for i, n in enumerate(self.builder_nodes) if n in ids]
        self.builders = [self.builders[i] for i in keep]
        self.builder_nodes = [self.builder_nodes[i] for i in keep]
        self.builder_makers = [self.builder_makers[i] for i in keep]
        roles = plan(alive, self.device, self.cores_per_measurer, self.measurers_per_node)
        started = []
        for r in roles:
            if r.node_id in self.nodes:
                continue
            if r.kind == "measurer":
                slot = _Slot(None, node_id=r.node_id, block=(r.index, r.cores))
                self._start(slot)
                self.slots.append(slot)
                started.append(slot)
            else:
                kind = BuilderActor
                if self.device == "gpu":
                    from actors.cuda_builder import CudaBuilderActor as kind
                make = _maker(kind, "builder", num_cpus=r.cpus, **_on(r.node_id))
                self.builder_makers.append(make)
                self.builders.append(make())
                self.builder_nodes.append(r.node_id)
        for slot in started:
            try:
                ray.get(slot.actor.ready.remote(), timeout=120)
            except RayError:  # its node left while the actor started
                self.slots.remove(slot)
        self.nodes = ids
        self.phased = phased(roles)
        self.spare_cores = 0  # phased on a cluster: no core of a node is free of measurement
        self.stats.measurers = len(self.slots)

    def _start(self, slot: _Slot) -> None:
        if getattr(self, "device", "cpu") == "gpu":  # one per GPU, with a CPU to drive it
            from actors.gpu_measure import GpuMeasurerActor
            slot.actor = GpuMeasurerActor.options(num_gpus=1, num_cpus=1, **_named("measurer"),
                                                  **_on(slot.node_id)).remote(self.opts)
            return
        cpus = len(slot.cores) if slot.cores is not None else slot.block[1]
        slot.actor = MeasurerActor.options(num_cpus=cpus, **_on(slot.node_id),
                                            **_named("measurer")).remote(
            slot.cores, self.opts, slot.block)

    def _build(self, item: tuple[Task, Config], k: int | None = None):
        """Submit one build, to builder `k` or to the next in turn."""
        if k is None:
            self._turn += 1
            k = self._turn % len(self.builders)
        task, cfg = item
        target = self.gpu_arch() if getattr(self, "device", "cpu") == "gpu" else self.mcpu
        ref = self.builders[k].build.remote(task.compute.to_json(), cfg.to_json(), target)
        self._build_node[ref] = (self.builder_nodes[k], self.builders[k])
        self._build_since[ref] = time.perf_counter()
        return ref

    def _build_pulled(self, items: list[tuple[Task, Config]]) -> list:
        """Phased builds, all done before any measurement: each builder is handed the next
        candidate when it is done with one, rather than a fixed share (builds differ tenfold:
        a fixed share leaves one builder working while the other waits). Measuring starts
        once nothing is left to hand out and the builds still running fit on the cores no
        measurer owns: the batch's last builds finish there, beside the first measurements,
        as every build does when a core is spare. Bounded: past the build timeout what is
        left is submitted at once, and _measure expires late builds."""
        refs: list = [None] * len(items)
        todo, free, busy = list(range(len(items))), list(range(len(self.builders))), {}
        deadline = time.perf_counter() + self.opts.build_timeout_s
        while todo or len(busy) > self.spare_cores:
            while todo and free:
                i, k = todo.pop(0), free.pop(0)
                refs[i] = self._build(items[i], k)
                busy[refs[i]] = k
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            done, _ = ray.wait(list(busy), num_returns=1, timeout=left)
            for ref in done:
                free.append(busy.pop(ref))
        for i in todo:
            refs[i] = self._build(items[i])
        return refs

    def gpu_arch(self) -> str:
        """The arch CUDA builders target: the one asked for, else the first measurer's GPU."""
        if self.arch is None:
            self.arch = ray.get(self.slots[0].actor.arch.remote())
        return self.arch

    def gpu_archs(self) -> list[str]:
        """The arch of every GPU measurer's device (a cluster may mix GPU generations)."""
        return ray.get([slot.actor.arch.remote() for slot in self.slots])

    def gpu_name(self) -> str:
        """The first GPU measurer's device name (what records name as their device)."""
        return ray.get(self.slots[0].actor.name.remote())

    def run(self, items: list[tuple[Task, Config]]) -> list[MeasureResult]:
        if self._stream is not None:
            raise RuntimeError("a batch cannot be run while a stream of rounds is open "
                               "(launch/wait); close_stream() first")
        start = time.perf_counter()
        if self.cluster:
            self.refresh()
        self._build_node, self._build_since = {}, {}  # this batch's builds only
        if self.phased:
            builds = self._build_pulled(items)
        else:
            builds = [self._build(item) for item in items]
        results = self._measure(items, builds)
        self.stats.wall_s += time.perf_counter() - start
        _raise_if_all_host(results)
        return results

    def measure_built(self, items: list[tuple[Task, Config]],
                      built: list[BuildResult]) -> list[MeasureResult]:
        """Measure libraries built elsewhere (e.g. injected faults) through the measurers."""
        self._build_node, self._build_since = {}, {}
        return self._measure(items, [ray.put(b) for b in built])

    # A stream of rounds (Tuner.stream's launch and wait): rounds are added while others
    # are built and measured, so that many measurers never wait for a batch's slowest
    # trial. Builds go to the builders as a round is launched; measurers take built
    # candidates in launch order. Only where builders have cores of their own (not phased).

    def launch(self, items: list[tuple[Task, Config]]) -> int:
        """Start building and measuring a round; its handle for `wait`."""
        if self.phased:
            raise RuntimeError("a stream of rounds needs builders on cores no measurer owns; "
                               "this pipeline builds on the measurers' cores (phased): run() "
                               "its batches instead")
        start = time.perf_counter()
        if self._stream is None:
            self._build_node, self._build_since = {}, {}
            self._open()
            self._stream, self._handles = {}, itertools.count()
        if self.cluster:
            self.refresh()
        span = self._add(items, [self._build(item) for item in items])
        handle = next(self._handles)
        self._stream[handle] = span
        self.stats.wall_s += time.perf_counter() - start
        return handle

    def wait(self, handles: list[int]) -> list[tuple[int, list[MeasureResult]]]:
        """Block until at least one of the rounds `handles` is done; [(handle, results)]
        for each done round, forgotten here once returned. Raises HostFault when every
        candidate of a done round failed for the machine's sake (as run() does)."""
        start = time.perf_counter()
        unknown = [h for h in handles if self._stream is None or h not in self._stream]
        if unknown:
            raise KeyError(f"no round in flight with handle(s) {unknown}")
        try:
            while not (done := [h for h in handles if self._finished(self._stream[h])]):
                self._spin()
        finally:
            self.stats.wall_s += time.perf_counter() - start
        out = []
        for h in done:
            span = self._stream.pop(h)
            out.append((h, [self._results[i] for i in span]))
            self._forget(span)
        for _, results in out:
            _raise_if_all_host(results)
        return out

    def close_stream(self) -> None:
        """Drop the rounds still in flight (their results will not be asked for)."""
        self._stream = None

    def _finished(self, span: range) -> bool:
        return all(self._results[i] is not None for i in span)

    def _forget(self, span: range) -> None:
        """Release what a returned round held: its builds (object-store entries), results
        and bookkeeping; its places in the lists stay, so indices do not move."""
        for i in span:
            ref = self._builds[i]
            self._build_node.pop(ref, None)
            self._build_since.pop(ref, None)
            self._since.pop(i, None)
            self._built.pop(i, None)
            self._builds[i] = self._items[i] = self._results[i] = None

    def _build_deadline(self) -> float | None:
        """When the oldest build still awaited passes the build timeout."""
        since = [self._build_since[r] for r in self._waiting if r in self._build_since]
        return min(since) + self.opts.build_timeout_s if since else None

    def _expire_builds(self, items, builds: list, results: list) -> None:
        """Builds past the build timeout (LLVM caught in a loop, a builder wedged): each is
        recorded as a build error and its builder is replaced by a fresh one; the other
        builds queued on that builder are submitted again, not blamed."""
        now = time.perf_counter()
        for ref, i in list(self._waiting.items()):
            since = self._build_since.get(ref)
            if since is None or now - since < self.opts.build_timeout_s or \
                    ref not in self._waiting:
                continue
            del self._waiting[ref]
            self._pending.remove(i)
            results[i] = MeasureResult.error(
                BUILD_ERROR, f"build ran past {self.opts.build_timeout_s:.0f} s; its builder "
                             f"was restarted", now - since)
            _, builder = self._build_node.pop(ref, (None, None))
            self.stats.build_timeouts += 1
            if builder is None:
                continue
            self._replace_builder(builder)
            for other, j in list(self._waiting.items()):
                if self._build_node.get(other, (None, None))[1] is builder:
                    del self._waiting[other]
                    self._build_node.pop(other, None)
                    self._rebuild(items, builds, j)

    def _replace_builder(self, builder):
        """A fresh actor, from the same maker, wherever `builder` serves (returned); the old
        one is killed for good. Not Ray's restart of the same actor: calls submitted to an actor
        while Ray restarts it can stall until its next restart (seen with Ray 2.60 on a
        loaded 2-core machine: a rebuild waited 60 s on a restarted, idle builder)."""
        for old, fresh in self._replaced:
            if old is builder:
                return fresh  # replaced already: several of its builds failed
        if not any(b is builder for b in self.builders):
            return None  # its node left the cluster
        ray.kill(builder, no_restart=True)
        fresh = None
        for k, b in enumerate(self.builders):
            if b is builder:
                fresh = fresh or self.builder_makers[k]()
                self.builders[k] = fresh
        self._replaced.append((builder, fresh))
        try:  # started (its imports done) before the builds it is given are timed against
            ray.get(fresh.ready.remote(), timeout=START_TIMEOUT_S)  # the build timeout
        except RayError:
            pass  # its node left, or it is slow to start: its builds expire as any
        return fresh

    def _build_again(self, i: int, ref) -> bool:
        """Whether a build whose builder died is done again: always when the builder's node
        left the cluster; otherwise once (on a fresh builder in its place), since a second
        death on the same candidate is the candidate's doing (an LLVM abort), not bad luck."""
        node, builder = self._build_node.pop(ref, (None, None))
        if self.cluster and node is not None and \
                node not in {n.node_id for n in alive_nodes()}:
            return True
        self._build_deaths[i] = self._build_deaths.get(i, 0) + 1
        if self._build_deaths[i] >= 2:
            return False
        if builder is not None:  # built again on the fresh builder, not on another that
            self._rebuild_on[i] = self._replace_builder(builder)  # may be dead as well
        return True

    def _rebuild(self, items, builds: list, i: int) -> None:
        if self.cluster:
            self.refresh()
        on = self._rebuild_on.pop(i, None)
        k = next((k for k, b in enumerate(self.builders) if b is on), None)
        builds[i] = self._build(items[i], k)
        self._waiting[builds[i]] = i
        self.stats.redone += 1

    def _measure(self, items, builds: list) -> list[MeasureResult]:
        self._open()
        self._add(items, builds)
        while self._pending or self._inflight:
            self._spin()
        return self._results  # type: ignore[return-value]

    def _open(self) -> None:
        """Empty state for a batch, or for a stream of rounds."""
        self._items: list = []
        self._builds: list = []
        self._results: list[MeasureResult | None] = []
        self._build_deaths: dict[int, int] = {}
        self._rebuild_on: dict = {}  # candidate -> the fresh builder to build it again on
        self._replaced: list = []  # (dead or wedged builder, the fresh one in its place)
        self._measure_deaths: dict[int, int] = {}
        self._host_tries: dict[int, int] = {}
        self._later: list[tuple[float, int, bool]] = []  # (when, index, build it again)
        self._pending: list[int] = []  # waiting for a build and a free measurer
        self._inflight: dict = {}  # ObjectRef -> (index, slot, build seconds)
        self._waiting: dict = {}  # build ObjectRef -> index
        # each trial's first build submission, and its build (seconds, phases) once taken
        self._since: dict[int, float] = {}
        self._built: dict[int, tuple[float, tuple]] = {}
        self._ready: list[int] = []

    def _add(self, items, builds: list) -> range:
        """Candidates `items`, submitted to the builders as `builds`, join the work."""
        first = len(self._items)
        self._items += items
        self._builds += builds
        self._results += [None] * len(items)
        for i, b in enumerate(builds, first):
            self._waiting[b] = i
            self._pending.append(i)
            if b in self._build_since:
                self._since[i] = self._build_since[b]
        return range(first, len(self._items))

    def _spin(self) -> None:
        """One turn of the loop: take finished builds, expire overdue ones, hand built
        candidates to free measurers, then wait for a measurement (or a build) to end."""
        items, builds, results = self._items, self._builds, self._results
        pending, inflight, ready = self._pending, self._inflight, self._ready
        waiting_build = self._waiting
        if not self.slots:
            self.refresh()  # every measurer was lost: take what the cluster has now
        done, _ = ray.wait(list(waiting_build), num_returns=len(waiting_build),
                           timeout=0) if waiting_build else ([], [])
        for ref in done:
            ready.append(waiting_build.pop(ref))
        self._expire_builds(items, builds, results)
        self._release_later(items, builds)
        self._dispatch(items, builds, ready, pending, inflight, results)
        if inflight:
            self._collect(items, inflight, results)
        elif pending and not ready and waiting_build:
            deadline = self._build_deadline()
            ray.wait(list(waiting_build), num_returns=1, timeout=None if deadline is None
                     else max(0.05, deadline - time.perf_counter()))
        elif pending and not ready and self._later:
            time.sleep(max(0.0, min(t for t, _, _ in self._later) - time.perf_counter()))

    def _retry_later(self, i: int, build_again: bool) -> bool:
        """Whether candidate `i`, failed for the host's sake, is tried again (after a
        wait: space may be freed meanwhile); after the last wait it is recorded."""
        n = self._host_tries[i] = self._host_tries.get(i, 0) + 1
        if n > len(HOST_RETRY_WAITS_S):
            return False
        print(f"{HOST_RETRY_LOG}: candidate tried again in {HOST_RETRY_WAITS_S[n - 1]:g} s "
              f"(the machine failed it)", file=sys.stderr, flush=True)  # the actor's log
        self._later.append((time.perf_counter() + HOST_RETRY_WAITS_S[n - 1], i, build_again))
        self.stats.redone += not build_again  # a build done again counts in _rebuild
        return True

    def _release_later(self, items, builds: list) -> None:
        now = time.perf_counter()
        for entry in [e for e in self._later if e[0] <= now]:
            self._later.remove(entry)
            _, i, build_again = entry
            if build_again:
                self._rebuild(items, builds, i)
            else:
                self._ready.append(i)

    def _dispatch(self, items, builds, ready, pending, inflight, results) -> None:
        busy = [id(v[1]) for v in inflight.values()]
        free = [s for s in self.slots if id(s) not in busy]
        ready.sort()
        while free and ready:
            i = ready.pop(0)
            try:
                built: BuildResult = ray.get(builds[i])
            except RayError as exc:  # its builder died: with its node, or by the build
                if self._build_again(i, builds[i]):
                    self._rebuild(items, builds, i)
                    continue
                built = BuildResult(None, "the builder process died building it, twice: "
                                    + _first_line(exc).split(": ", 1)[-1], 0.0)
            if built.error and built.host and self._retry_later(i, build_again=True):
                continue  # still pending: built again after a wait
            pending.remove(i)
            self._built[i] = (built.seconds, getattr(built, "phases", ()))  # CUDA: none
            if built.error:
                results[i] = MeasureResult.error(HOST_ERROR if built.host else BUILD_ERROR,
                                                 built.error, built.seconds)
                self._account(i, time.perf_counter())
                continue
            slot = free.pop(0)
            task, cfg = items[i]
            slot.busy_since = time.perf_counter()
            ref = slot.actor.measure.remote(task.compute.to_json(), cfg.to_json(),
                                            built.library, built.seconds)
            inflight[ref] = (i, slot, built.seconds)

    def _collect(self, items, inflight, results) -> None:
        now = time.perf_counter()
        deadline = min(s.busy_since for _, s, _ in inflight.values()) + self.opts.timeout_s
        build_deadline = self._build_deadline()  # wake for an overdue build as well
        if build_deadline is not None:
            deadline = min(deadline, max(build_deadline, now + 0.05))
        done, _ = ray.wait(list(inflight), num_returns=1, timeout=max(0.0, deadline - now))
        if done:
            ref = done[0]
            i, slot, build_s = inflight.pop(ref)
            back = time.perf_counter()
            self.stats.measure_busy_s += back - slot.busy_since
            try:
                results[i] = MeasureResult.from_json(ray.get(ref))
                if results[i].error_kind == HOST_ERROR and \
                        self._retry_later(i, build_again=False):
                    results[i] = None
                    self._pending.append(i)  # measured again after a wait
                else:
                    self._account(i, slot.busy_since, results[i], back)
            except RayError as exc:  # the measurer died (RayActorError), or cannot come
                # back where it was pinned because its node is gone (ActorUnschedulableError)
                if self._node_lost(slot):  # not the candidate's fault: measure it elsewhere
                    if slot in self.slots:  # a refresh may have dropped it already
                        self.slots.remove(slot)
                    self._pending.append(i)  # built already: back in line for a measurer
                    self._ready.append(i)
                    self.stats.redone += 1
                    self.stats.measurers = len(self.slots)
                    return
                self._await_restart(slot)
                self._measure_deaths[i] = self._measure_deaths.get(i, 0) + 1
                if self._measure_deaths[i] < 2:  # once may be bad luck (the OOM killer, an
                    self._pending.append(i)      # operator's kill): measure it again
                    self._ready.append(i)
                    self.stats.redone += 1
                    return
                results[i] = MeasureResult.error(  # twice: the candidate takes it down
                    CRASHED, _first_line(exc) + " (twice, on a restarted measurer)", build_s)
            return
        for ref, (i, slot, build_s) in list(inflight.items()):
            if time.perf_counter() - slot.busy_since >= self.opts.timeout_s:
                inflight.pop(ref)
                self.stats.measure_busy_s += time.perf_counter() - slot.busy_since
                results[i] = MeasureResult.error(
                    TIMEOUT, f"ran past {self.opts.timeout_s:.0f} s; measurer replaced", build_s)
                ray.kill(slot.actor, no_restart=True)  # a timed-out actor is never reused
                self._start(slot)

    def _account(self, i: int, taken: float, result: MeasureResult | None = None,
                 done: float = 0.0) -> None:
        """Add trial i's phases to the stats: its build's, the time from its first build
        submission until a measurer took it (`taken`) less the build, and its measurement's
        with the rest of the call (until `done`) as Ray's."""
        build_s, phases = self._built.get(i, (0.0, ()))
        self.stats.timed_trials += 1
        if i in self._since:  # built by our builders, not elsewhere (measure_built)
            self.stats.add_phases(phases)
            self.stats.queue_s += max(0.0, taken - self._since[i] - build_s)
        if result is not None:
            self.stats.add_phases(result.phases)
            self.stats.call_s += max(0.0, done - taken - result.run_s)

    def _node_lost(self, slot: _Slot, limit_s: float = 20.0) -> bool:
        """Whether a dead measurer died with its node (rather than by its candidate): the
        node leaves the live list, or the actor comes back on it (then it was a crash)."""
        if not self.cluster:
            return False
        end = time.perf_counter() + limit_s
        while time.perf_counter() < end:
            if slot.node_id not in {n.node_id for n in alive_nodes()}:
                return True
            try:
                ray.get(slot.actor.ready.remote(), timeout=1.0)
                return False
            except RayError:  # dead, restarting, unschedulable, or not answering yet
                time.sleep(0.2)
        return True  # neither back nor reported dead within the limit: treat it as lost

    def _await_restart(self, slot: _Slot, limit_s: float = 60.0) -> None:
        """Ray restarts a crashed measurer; calls made while it restarts would fail, so the
        slot gets no work until it answers again (or is replaced after `limit_s`)."""
        end = time.perf_counter() + limit_s
        while time.perf_counter() < end:
            try:
                ray.get(slot.actor.ready.remote(), timeout=limit_s)
                return
            except RayError:
                time.sleep(0.1)
        ray.kill(slot.actor, no_restart=True)
        self._start(slot)

    def shutdown(self) -> None:
        for a in self.builders + [s.actor for s in self.slots]:
            ray.kill(a, no_restart=True)


def _raise_if_all_host(results: list[MeasureResult]) -> None:
    if results and all(r.error_kind == HOST_ERROR for r in results):
        waited = sum(HOST_RETRY_WAITS_S)
        raise HostFault(f"every candidate of the batch failed for this machine's sake, "
                        f"also after {waited:.0f} s of retries: {results[0].error_msg}; "
                        f"the records so far are kept: free it and resume")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"measurer process died: {text[0] if text else type(exc).__name__}"[:500]
