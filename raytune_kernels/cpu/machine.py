"""The host's machine model, measured rather than assumed.

Cores differ where the analytic estimate and the space rules care: a core with 128-bit FMA
units issues one 256-bit FMA per cycle (two halves) at a latency of 5, a core with two
256-bit FMA pipes two at 4, and L1/L2 sizes vary by a factor of two or more. So at first use on a host, short
microbenchmarks built through our own IR and builder measure, for each vector width the
CPU has:
- FMA throughput: peak.py's kernel, many independent accumulator chains of broadcast
  FMAs with two B vectors a step, so that the broadcasts' loads never bind;
- FMA latency: a single chain, so every FMA waits for the one before;
- load throughput: elementwise FMAs that load two vectors each from an L1-resident
  window that moves every step (a lower bound where the FMAs bind first);
and the core clock from a chain of dependent integer adds (one cycle each on every x86
core), which turns seconds into cycles. Cache sizes come from the OS. Two bandwidths of one
core, in bytes per cycle of that clock, price what the caches do not hold: re-reading a
footprint that L3 holds and L2 does not (STREAM_L3: 4x L2, within half of L3), and
streaming one beyond L3 (twice L3, as the tuner's rotating weight copies span, within
STREAM_MEMORY). Their figures differ by an order of magnitude between machines: a virtual
machine whose OS reports the host's L3 re-read 8 MB at ~7 bytes a cycle and memory at
~4, where the estimate's fixed figures had assumed 32 and 8 (cpu/estimate.py). The result
is cached per CPU name and feature string in the user's cache directory, with a version.

Two more figures price the rows of a register tile that read A as separate runs of
lines (a GEMM's tile rows, each K apart): how many such runs the core's prefetchers keep
ahead of the loads, and what each run beyond them costs an update (_streams: the same
broadcast-FMA update timed with A in L1 and past it). Cores differ widely here: the
estimate's fixed figures (8 rows, then 0.875 cycles an update a row) came from a core
that lost that much, and another core ran 28 rows as fast from L2 as from L1; priced at
the fixed figures, its long tiles (an im2col GEMM's 26 rows) ranked among the slowest
configs where they ran mid-field.

Every figure is the best of several repeats: noise on a shared core only adds time.
Cycle counts are rounded to what hardware has: whole cycles of latency, and FMA pipes to
the half, which the schedule space's accumulator-chain rule reads. The estimate reads the
FMAs a cycle to the quarter: a core that lowers its clock for its widest vectors issues a
fraction of its pipes a cycle of the scalar clock (1.2-1.6 where two 512-bit pipes run
below a 3.6-4 GHz scalar clock, which the half rounds to 1, as many flops as its 256-bit
FMAs). Bandwidths keep two significant digits. So two measurements on one CPU model give
one model, or near one: where a figure sits on a rounding edge, a host keeps what it
measured first (measure_model's `keep`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, replace

import llvmlite.ir as ir
import numpy as np

from raytune_kernels.cpu.build import LoadedKernel, aligned, build, host_cpu, permit_amx
from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.cpu.peak import STEPS as PEAK_STEPS, peak_nest
from raytune_kernels.cpu.loopnest import (BCAST_FMA, SERIAL, UNROLL, VEC_FMA, Access, Affine,
                                          Buffer, For, LoopNest, StoreTile, Tile, UpdateTile,
                                          ZeroTile)

AVX512_CPUS = ("skylake-avx512", "cascadelake", "cooperlake", "icelake", "tigerlake",
               "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5",
               "x86-64-v4", "rocketlake", "alderlake-avx512")
VERSION = 4
STREAM_L3 = (8 << 20, 32 << 20)  # bytes re-read from L3: 4x L2, clamped here (and < L3 / 2)
STREAM_MEMORY = (64 << 20, 512 << 20)  # bytes streamed from memory: 2x L3, clamped here
STEPS = 20000  # FMA steps per microbenchmark call: ~0.1-1 ms
WINDOW = 16  # load benchmark: steps before its operand window wraps (stays in L1)
CLOCK_ADDS, CLOCK_LOOPS = 100, 20000
STREAM_ROWS = (8, 12, 16, 20, 24, 28)  # tile rows timed (those the registers hold)
STREAM_SLOWER = 1.15  # rows read from L2 this much slower than from L1 wait on it
STREAM_UPDATES = 400_000  # broadcast FMAs of one timed call (~0.1-0.3 ms)


@dataclass(frozen=True)
class VectorUnit:
    """Measured behaviour of vector FMAs of one width, in core cycles."""

    lanes: int
    fma_per_cycle: float  # independent vector FMAs issued per cycle, to the quarter
    fma_latency: float  # cycles before an FMA's result feeds the next
    loads_per_cycle: float  # vector loads per cycle from L1 (a lower bound)
    # the FMA pipes: FMAs a cycle to the half (the schedule space's rules read them)
    fma_pipes: float | None = None

    @property
    def pipes(self) -> float:
        return self.fma_pipes if self.fma_pipes is not None else _half(self.fma_per_cycle)

    @property
    def chains(self) -> int:
        """Accumulator chains that keep the FMA pipes busy: latency x pipes."""
        return max(1, round(self.fma_latency * self.pipes))


@dataclass(frozen=True)
class MachineModel:
    """What the estimate, the space rules and the cost-model features know of a CPU."""

    cpu: str
    units: tuple[VectorUnit, ...]
    ghz: float
    caches: tuple[int, int, int]  # bytes of L1d, L2 and L3 (the OS's figures)
    # bytes a cycle one core re-reads from L3, and streams from memory
    l3_bytes_per_cycle: float = 32.0
    dram_bytes_per_cycle: float = 8.0
    # tile rows of A read as separate runs of lines that the prefetchers keep ahead, and
    # the cycles an update waits for each row beyond them (module docstring)
    a_streams: int = 8
    stream_wait: float = 0.875
    measured: bool = True  # False: assumed, for a CPU other than the host
    version: int = VERSION

    def unit(self, lanes: int) -> VectorUnit:
        """The unit of `lanes`-float vectors. Narrower ones (scalar tails, 4-float rows)
        issue on the same FMA pipes at the same latency as the narrowest measured width."""
        for u in self.units:
            if u.lanes == lanes:
                return u
        narrowest = min(self.units, key=lambda u: u.lanes)
        if lanes < narrowest.lanes:
            return VectorUnit(lanes, narrowest.fma_per_cycle, narrowest.fma_latency,
                              narrowest.loads_per_cycle)
        raise ValueError(f"machine model of {self.cpu} has no {lanes}-float vector unit "
                         f"(it has {[u.lanes for u in self.units]})")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "MachineModel":
        fields = {**d, "units": tuple(VectorUnit(**u) for u in d["units"]),
                  "caches": tuple(d["caches"])}
        return cls(**fields)

    def describe(self) -> str:
        units = ", ".join(f"{u.lanes} lanes: {u.fma_per_cycle:g} FMA/cycle, latency "
                          f"{u.fma_latency:g}, {u.loads_per_cycle:g} loads/cycle"
                          for u in self.units)
        kib = [c >> 10 for c in self.caches]
        return (f"{self.cpu} at {self.ghz:.2f} GHz ({'measured' if self.measured else 'assumed'}"
                f"): {units}; L1d {kib[0]} KiB, L2 {kib[1]} KiB, L3 {kib[2]} KiB; "
                f"{self.l3_bytes_per_cycle:g} bytes/cycle from L3, "
                f"{self.dram_bytes_per_cycle:g} from memory; {self.a_streams} rows streamed "
                f"from L2 at L1's speed, {self.stream_wait:g} cycles an update for each "
                f"beyond")


@dataclass(frozen=True)
class CpuInfo:
    """What the schedule space, the estimate and the features need to know of a CPU."""

    name: str
    lanes: tuple[int, ...]  # vector widths (floats) worth trying, widest first
    regs: int  # vector registers
    machine: MachineModel
    amx: bool = False  # AMX tiles with bf16 dot products (amx-tile, amx-bf16)

    def chains(self, lanes: int) -> int:
        """Fewest accumulator chains a register tile of `lanes`-float vectors should have."""
        return self.machine.unit(lanes).chains


# the instruction sets that decide which kernels run and how fast: what records key on
VECTOR_ISA = ("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw",
              "avx512dq", "avx512vnni", "avx512bf16", "avx512fp16", "amx-tile", "neon", "sve",
              "sve2")


def host_isa(features: str | None = None) -> str:
    """The host's vector instruction sets among VECTOR_ISA, comma-separated ("" if none)."""
    flags = set((features if features is not None else host_cpu()[1]).split(","))
    return ",".join(f for f in VECTOR_ISA if f"+{f}" in flags)


def host_device() -> tuple[str, str]:
    """(LLVM's name for the host CPU, its vector ISA): what a CPU record is measured on."""
    name, features = host_cpu()
    return name, host_isa(features)


def host_amx(features: str) -> bool:
    """Whether AMX's bf16 tiles run here: the CPU has them (amx-tile, amx-bf16) and the
    OS hands this process their state."""
    flags = features.split(",")
    if "+amx-tile" not in flags or "+amx-bf16" not in flags:
        return False
    return permit_amx()


def cpu_info(mcpu: str | None = None) -> CpuInfo:
    """Vector widths, register count and machine model for the host CPU or a named one.
    A named CPU runs on the host's hardware, so it shares the host's measured vector
    units where the host has its widths."""
    name, features = host_cpu()
    flags = features.split(",")
    wide = "+avx512f" in flags
    host_lanes = (16, 8) if wide else (8,)
    host_regs = 32 if wide or "+avx512vl" in flags else 16
    host = host_model(host_lanes, host_regs)
    if not mcpu or mcpu == name:
        return CpuInfo(name, host_lanes, host_regs, host, host_amx(features))
    lanes, regs = ((16, 8), 32) if mcpu.startswith(AVX512_CPUS) else ((8,), 16)
    if set(lanes) <= set(host_lanes):
        units = tuple(host.unit(n) for n in lanes)
        return CpuInfo(mcpu, lanes, regs, replace(host, units=units))
    return CpuInfo(mcpu, lanes, regs, assumed_model(mcpu, lanes))


def assumed_model(cpu: str, lanes: tuple[int, ...]) -> MachineModel:
    """A model for a CPU that is not the host, where nothing can be measured: two FMA
    pipes at latency 4 and two loads per cycle (x86 cores since Haswell), common cache
    sizes and the bandwidths' defaults. Marked measured=False wherever it is shown."""
    units = tuple(VectorUnit(n, 2.0, 4.0, 2.0) for n in lanes)
    return MachineModel(cpu, units, 3.0, (32 << 10, 1 << 20, 32 << 20), measured=False)


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "raytune_kernels", "machine")


def model_path(cpu: str, features: str, directory: str | None = None,
               version: int = VERSION) -> str:
    digest = hashlib.sha256(f"{cpu}|{features}|{version}".encode()).hexdigest()[:16]
    return os.path.join(directory or cache_dir(), f"{cpu}-{digest}.json")


@functools.cache
def host_model(lanes: tuple[int, ...], regs: int) -> MachineModel:
    """The host's model: read from the cache, or measured once and cached."""
    return load_or_measure(model_path(*host_cpu()), lanes, regs,
                           [model_path(*host_cpu(), version=v) for v in (3, 2)])


def load_or_measure(path: str, lanes: tuple[int, ...], regs: int,
                    older: str | list[str] | None = None) -> MachineModel:
    """The model cached at `path` if it is of this version and has every width in
    `lanes`; otherwise measured now and cached there. Where `older` (a path or paths,
    newest first) holds this host's model of an earlier version, what it measured stays,
    so that estimates and spaces move only by what the new version adds: a version-3
    model keeps every figure and has the streams measured; a version-2 model keeps its
    FMA latency and pipes (measure_model's `keep`)."""
    try:
        with open(path) as f:
            model = MachineModel.from_json(json.load(f))
        if model.version == VERSION and {u.lanes for u in model.units} >= set(lanes):
            return model
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, unreadable or from another version: measure again
    older = [older] if isinstance(older, str) else older or []
    previous = next((m for m in map(_version3_model, older) if m is not None
                     and {u.lanes for u in m.units} >= set(lanes)), None)
    if previous is not None:
        model = replace(previous, **_streams(previous.units[0].lanes, regs, previous.ghz,
                                             previous.caches), version=VERSION)
    else:
        keep = next((u for u in map(_version2_units, older) if u is not None), None)
        model = measure_model(lanes, regs, keep)
    _save(model, path)
    return model


def _version3_model(path: str) -> MachineModel | None:
    """The measured version-3 model cached at `path`, or None where there is none."""
    try:
        with open(path) as f:
            d = json.load(f)
        if d["version"] == 3 and d["measured"]:
            return MachineModel.from_json(d)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _version2_units(path: str) -> dict[int, dict] | None:
    """The vector units of the version-2 model cached at `path` (lanes -> its fields),
    or None where there is none."""
    try:
        with open(path) as f:
            d = json.load(f)
        if d["version"] == 2 and d["measured"]:
            return {int(u["lanes"]): u for u in d["units"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _save(model: MachineModel, path: str) -> None:
    """Atomically, so that processes measuring at once never read half a file."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(model.to_json(), f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the model is measured again next time, nothing is wrong


def measure_model(lanes: tuple[int, ...], regs: int,
                  keep: dict[int, dict] | None = None) -> MachineModel:
    """Run the microbenchmarks on the calling thread (about half a second in all). `keep`:
    a model measured before on this host (lanes -> VectorUnit fields), whose FMA latency
    and pipes (its FMAs a cycle, to the half) stay for its widths: they decide the schedule
    space's accumulator chains, and a space that changed would drop records written in it
    (a latency measured 4.5-4.9 rounds either way)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise RuntimeError(f"the CPU backend targets x86-64; this host is {platform.machine()}")
    ghz = _clock_ghz()
    units = tuple(_unit(n, regs, ghz) for n in lanes)
    keep = keep or {}
    units = tuple(replace(u, fma_latency=float(keep[u.lanes]["fma_latency"]),
                          fma_pipes=float(keep[u.lanes]["fma_per_cycle"]))
                  if u.lanes in keep else u for u in units)
    caches = os_caches()
    l2, l3 = caches[1] or 1 << 20, caches[2]
    l3_bytes = _clamp(4 * l2, STREAM_L3)
    l3_bytes = min(l3_bytes, l3 // 2) if l3 else l3_bytes
    memory = _clamp(2 * l3, STREAM_MEMORY)
    return MachineModel(host_cpu()[0], units, round(ghz, 2), caches,
                        _stream_bytes_per_cycle(l3_bytes, ghz, 5),
                        _stream_bytes_per_cycle(memory, ghz, 2),
                        **_streams(lanes[0], regs, ghz, caches))


def _clamp(x: int, bounds: tuple[int, int]) -> int:
    return min(max(x, bounds[0]), bounds[1])


def _stream_bytes_per_cycle(nbytes: int, ghz: float, tries: int) -> float:
    """Bytes a cycle one core reads through a buffer of `nbytes` over and over (a
    vectorised max, which the loads bind), the best of `tries` passes after one that warms
    the caches up; two significant digits."""
    buf = np.ones(nbytes // 4, np.float32)
    return float(f"{nbytes / (_best_of(buf.max, tries) * ghz):.2g}")


def _unit(lanes: int, regs: int, ghz: float) -> VectorUnit:
    per_ns = ghz  # cycles per ns
    thr = peak_nest(1, lanes, regs)  # two B vectors a step: broadcasts do not bind
    lat = _chain_nest(lanes)
    ld = _load_nest(lanes, chains=min(12, regs - 4))
    tile = thr.tiles[0]
    fma_per_cycle = PEAK_STEPS * tile.rows * tile.vecs / (_best_ns(thr) * per_ns)
    latency = _best_ns(lat) * per_ns / STEPS
    loads_per_cycle = 2 * STEPS * min(12, regs - 4) / (_best_ns(ld) * per_ns)
    return VectorUnit(lanes, max(0.5, round(fma_per_cycle * 4) / 4),
                      float(max(1, round(latency))), _half(loads_per_cycle),
                      _half(fma_per_cycle))


def _streams(lanes: int, regs: int, ghz: float, caches: tuple[int, int, int]) -> dict:
    """a_streams and stream_wait (module docstring). For each row count of STREAM_ROWS
    that the registers hold (the accumulators, a B vector and a broadcast): a tile of one
    `lanes`-float vector a row, updated over K steps of A's rows, timed with K short (A
    in L1) and long (A past L1, within L2). The rows the prefetchers keep up with: the
    most before the first count that runs STREAM_SLOWER or more slower long than short
    (and the next count too); the wait: the median, over the slower counts, of the extra
    cycles an update per row beyond those (the older fixed figure where none is slower)."""
    l1, l2 = caches[0] or 32 << 10, caches[1] or 1 << 20
    rows = [r for r in STREAM_ROWS if r + 2 <= regs] or [STREAM_ROWS[0]]
    long = max(2 * l1 // (4 * rows[0]), 1024) // 1024 * 1024  # twice L1 at the fewest
    long = min(long, max(1024, 3 * l2 // (16 * rows[-1]) // 1024 * 1024))  # L2 at most
    found = []
    for r in rows:
        per_update = []
        for k in (64, long):
            reps = max(1, STREAM_UPDATES // (k * r))
            per_update.append(_best_ns(_stream_nest(lanes, r, k, reps)) * ghz / (reps * k))
        found.append((r, per_update[1] - per_update[0], per_update[1] / per_update[0]))
    # a lone slow count is noise: what rows beyond the prefetchers' cost only grows
    slow = next((i for i, (_, _, ratio) in enumerate(found) if ratio >= STREAM_SLOWER
                 and (i + 1 == len(found) or found[i + 1][2] >= STREAM_SLOWER)), None)
    if slow is None:
        return {"a_streams": rows[-1], "stream_wait": MachineModel.stream_wait}
    kept = rows[slow - 1] if slow else rows[0] // 2
    waits = sorted(max(0.0, extra) / (r - kept) for r, extra, _ in found[slow:])
    return {"a_streams": kept, "stream_wait": round(waits[len(waits) // 2], 2)}


def _stream_nest(lanes: int, rows: int, k: int, reps: int) -> LoopNest:
    """`reps` passes of a (rows x 1 vector) broadcast-FMA tile over `k` steps (a multiple
    of 64). A's rows lie a line more than k floats apart, off the L1's set period, so
    that no set holds more of them than another (set conflicts are priced apart); B
    cycles through 64 vectors (4 KiB at most), so that it stays in L1 and its loads
    stay in the loop."""
    tile = Tile("t", (rows, 1), 1)
    a = Affine((("kb", 64), ("kq", 8), ("ki", 1)))
    b = Affine((("kq", 8 * lanes), ("ki", lanes)))
    update = UpdateTile("t", Access("a", a), (k + 16, 0), Access("b", b), BCAST_FMA)
    steps = For("kq", 8, SERIAL, (For("ki", 8, UNROLL, (update,)),))
    body = (ZeroTile("t"),
            For("r", reps, SERIAL, (For("kb", k // 64, SERIAL, (steps,)),)),
            StoreTile("t", Access("out", Affine()), (lanes, 0)))
    bufs = (Buffer("a", rows * (k + 16), "in"), Buffer("b", 64 * lanes, "in"),
            Buffer("out", rows * lanes, "out"))
    return LoopNest(f"rk_streams_{lanes}_{rows}_{k}_{reps}", bufs, (tile,), body, lanes)


def _half(x: float) -> float:
    return max(0.5, round(x * 2) / 2)


def _chain_nest(lanes: int) -> LoopNest:
    """One accumulator: every broadcast FMA waits for the one before."""
    tile = Tile("t", (1, 1), 1)
    body = (ZeroTile("t"),
            For("k", STEPS, SERIAL, (UpdateTile("t", Access("a", Affine()), (0, 1),
                                                Access("b", Affine())),)),
            StoreTile("t", Access("out", Affine()), (0, lanes)))
    bufs = (Buffer("a", 1, "in"), Buffer("b", lanes, "in"), Buffer("out", lanes, "out"))
    return LoopNest(f"rk_chain_{lanes}", bufs, (tile,), body, lanes)


def _load_nest(lanes: int, chains: int) -> LoopNest:
    """Elementwise FMAs over a window of WINDOW steps that repeats: two vector loads each,
    at addresses that change every step, so no load is hoisted out of the loop."""
    tile = Tile("t", (1, chains), 1)
    step = chains * lanes
    update = UpdateTile("t", Access("a", Affine((("j", step),))), (0, lanes),
                        Access("b", Affine((("j", lanes),))), VEC_FMA)
    body = (ZeroTile("t"),
            For("k", STEPS // WINDOW, SERIAL, (For("j", WINDOW, SERIAL, (update,)),)),
            StoreTile("t", Access("out", Affine()), (0, lanes)))
    bufs = (Buffer("a", WINDOW * step, "in"), Buffer("b", WINDOW * lanes, "in"),
            Buffer("out", step, "out"))
    return LoopNest(f"rk_load_{lanes}_{chains}", bufs, (tile,), body, lanes)


def _best_ns(nest: LoopNest, tries: int = 7) -> float:
    """Fastest of `tries` calls of the built nest, in ns, after a warm-up call."""
    result = build(render(nest))
    if result.error:
        raise RuntimeError(f"machine microbenchmark {nest.name}: {result.error}")
    kernel = LoadedKernel(result.library, nest.name, len(nest.buffers))
    rng = np.random.default_rng(0)
    bufs = [aligned(rng.standard_normal(b.size).astype(np.float32) * 1e-3) for b in nest.buffers]
    ptrs = [b.ctypes.data for b in bufs]
    return _best_of(lambda: kernel(ptrs, 1), tries)


def _best_of(call, tries: int) -> float:
    call()
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter_ns()
        call()
        best = min(best, time.perf_counter_ns() - start)
    return best


def _clock_ghz() -> float:
    """Core cycles per ns: CLOCK_LOOPS iterations of CLOCK_ADDS dependent adds of a
    register to a register, one cycle each on every x86 core. (Not of an immediate: cores
    that fold add-immediate chains at rename run several a cycle, and the clock came out
    at 20+ GHz.)"""
    i64, ptr = ir.IntType(64), ir.PointerType()
    mod = ir.Module(name="rk_clock")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr, ir.IntType(32)]), "rk_clock")
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i, x = b.phi(i64), b.phi(i64)
    adds = ir.InlineAsm(ir.FunctionType(i64, [i64, i64]), "\n".join(["add $2, $0"] * CLOCK_ADDS),
                        "=r,0,r,~{flags}", side_effect=True)
    y = b.call(adds, [x, ir.Constant(i64, 1)])
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(ir.Constant(i64, 0), entry), i.add_incoming(nxt, loop)
    x.add_incoming(ir.Constant(i64, 0), entry), x.add_incoming(y, loop)
    b.cbranch(b.icmp_unsigned("<", nxt, ir.Constant(i64, CLOCK_LOOPS)), loop, done)
    b.position_at_end(done)
    b.store(y, fn.args[0])
    b.ret_void()
    result = build(str(mod))
    if result.error:
        raise RuntimeError(f"clock microbenchmark: {result.error}")
    kernel = LoadedKernel(result.library, "rk_clock", 1)
    out = np.zeros(1, np.int64)
    ns = _best_of(lambda: kernel([out.ctypes.data], 1), 9)
    return CLOCK_ADDS * CLOCK_LOOPS / ns


def os_caches() -> tuple[int, int, int]:
    """(L1d, L2, L3) bytes from sysfs; 0 for a level the OS does not report."""
    sizes = {1: 0, 2: 0, 3: 0}
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for entry in entries:
        level, kind, size = (_read(os.path.join(root, entry, f))
                             for f in ("level", "type", "size"))
        if level in ("1", "2", "3") and kind in ("Data", "Unified") and size:
            sizes[int(level)] = _bytes(size)
    return sizes[1], sizes[2], sizes[3]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _bytes(size: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
