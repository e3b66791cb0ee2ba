"""An analytic estimate of a CPU loop nest's cycles, the search's guide before any
measurement has trained the cost model.

Each register-tile update is bound by the slowest of three limits: the FMA pipes (one
vector FMA per accumulator), the load ports (a broadcast per tile row x column and a
vector per B vector for outer products; two vectors per accumulator for elementwise
products) and the FMA latency (every accumulator chain waits for its previous update).
Loops that are not unrolled cost a cycle per iteration, tiles cost their initialisation,
and stores cost a cycle per vector and per epilogue step. Row kernels (softmax, layer norm,
elementwise) cost their vector expressions per step, and a reduction waits on the latency
of its `accs` accumulator chains.

The machine's figures (FMA pipes, FMA latency, load ports per vector width) come from its
measured model (cpu/machine.py): a core that splits a 256-bit FMA into two 128-bit halves
issues one per cycle at latency 5 where a core with two 256-bit FMA pipes issues two at
latency 4, and an estimate that assumed one core ranked configs on the other close to
randomly (rank correlation 0.37).

Measured by bench/estimate.py on random configs of ResNet-18's 19 conv and dense tasks (1
thread): with warm caches (160 configs a task) the estimate's ranks correlate with
the measured ones at 0.87 on average, and its first 8 picks hold a config within 5% of the
best on 17 tasks (8 random picks would on 9.2 tasks, in expectation); with the weights out of
cache, as tune_network times them (80 configs a task), 0.82 and 14 tasks (random: 7.0).
Those figures predate the memory terms below. A general reuse-distance term (bytes
re-fetched per loop, priced by the cache level their footprint fits) did not rank
ResNet-18's convs better with cold weights, so only narrower effects are priced, each
because it decides between tiles the compute bounds find equal (measured with 2 threads
and weights cold; docs/measurement.md names the machine):
- L1 set conflicts: the rows of a register tile read A at a fixed stride; where it is a
  multiple of the L1's set period (4 KiB on a VIPT L1 indexed inside a page), more rows
  share one set than the cache has ways and every broadcast misses (dense 128x2048 -> 512:
  52% of peak with 16 rows 8 KiB apart, 86% with 9);
- B's vectors come from L2 (a weight panel outgrows L1 in all but the smallest GEMMs) at
  L2_BYTES_PER_CYCLE, which bounds short tiles of many vectors (2 rows of 4 vectors);
- the prefetchers follow a few streams only: runs of adjacent A lines (a GEMM's tile
  rows, each K apart; a conv's tile columns make one run) beyond the machine's
  `a_streams` each cost an update its `stream_wait` cycles (both measured per host,
  cpu/machine.py; a core that kept 8 streams lost 0.9 cycles an update for each beyond:
  dense 128x768 -> 768 ran 316 us with 8 rows of 2 vectors, 389 us with 13 rows and 481
  us with 16 rows of one vector);
- an operand that a loop does not index is read again on each of its iterations, as much
  of it as the loops inside touch; where that exceeds what L2 keeps (three quarters of it,
  the rest for the other operands), each pass streams it from L3 or memory at
  RESTREAM_OVERLAP times the machine's measured L3 bandwidth (cpu/machine.py): row tiles
  outside output blocks re-read every weight once per row tile (dense 128x768 -> 768: 316
  us with output blocks outside, 383 us inside);
- the weights come from memory (the tuner times them out of cache, as a network reads
  them), once per thread that needs all of them: a thread's share of a parallel loop that
  does not index them (tile rows, Winograd's tiles) reads every weight. Memory is shared
  by the threads: those bytes over the machine's measured memory bandwidth are added to
  the compute, not overlapped with it (a roofline's max ties every config of a memory-bound
  kernel and loses the compute's ranking: ResNet-18's dense fell to a rank correlation of
  0). It
  decides between schedules whose compute bounds are equal: ResNet-18's 7x7x512 Winograd
  kernels stream 17 MB of transformed weights, and measured 380-1000 us by loop order
  where the compute bounds gave ~1089k cycles for all. On bench/estimate.py's random
  configs (1 thread, weights cold) the mean rank correlation went from 0.753 to 0.766 and
  the first 8 picks hit within 5% of the best on 14 tasks of 19 against 13. Against the
  tuners' own 2-thread records (ranked at 2 threads) it went from 0.50 to 0.52 on
  ResNet-18's conv tasks (0.61 to 0.73 on one 7x7 task), 0.53 to 0.54 on ResNet-50's
  and 0.33 to 0.37 on MobileNetV2's (bench/results/znver5/network_*_2threads.jsonl); those
  records crowd near each task's best, and there the first 8 picks hit within 5% less
  often (ResNet-18 4 tasks of 15 against 8, MobileNetV2 12 of 29 against 15).

With `threads`, a parallel loop's iterations are shared out statically (the busiest
thread's share counts) and opening the parallel region costs FORK_CYCLES, so a small row
kernel stays serial and a large one is split; at 1 thread the two cost the same.
"""
from __future__ import annotations

import functools

from raytune_kernels.cpu.loopnest import (BCAST_FMA, PARALLEL, UNROLL, VEC_FMA, AmxGemm, Bin,
                                          For, Ld, LoopNest, Map, MapGroup, Reduce, Split,
                                          StoreTile, Un, UpdateTile, ZeroTile)
from raytune_kernels.cpu.machine import MachineModel, VectorUnit

LOOP_CYCLES = 1.0  # increment, compare and branch of a loop that is not unrolled
FORK_CYCLES = 2000.0  # opening and joining a parallel region (~0.45 us, bench/dispatch.py)
SET_PERIOD = 4096  # bytes after which L1 set indices repeat (a VIPT L1 is indexed in-page)
LINE = 64  # cache line bytes
MISS_CYCLES = 1.25  # per A line that misses L1 in an update (an L2 hit, overlapped)
L2_BYTES_PER_CYCLE = 32.0  # sustained L2 -> L1 bandwidth of one core
# a re-read operand is priced at this multiple of the machine's measured L3 bandwidth,
# as it overlaps the FMAs in part (the fixed 64 bytes a cycle it replaces, fitted to the
# dense gaps above, over-priced them by up to 1.6x and never under)
RESTREAM_OVERLAP = 2.0
# AMX (cpu/amx.py): a tile dot product (16x32 by 32x16 bf16) issues every 16 cycles on a
# core; a tile load (1 KiB) from L1 or L2 takes about 8 cycles, overlapped with the dots
AMX_DOT_CYCLES, AMX_LOAD_CYCLES = 16.0, 8.0
TRANSCENDENTAL_OPS = 12  # vector ops of an inlined exp, tanh or sqrt polynomial
CHEAP_OPS = ("relu", "relu6", "hardswish", "hardsigmoid")  # a few selects and multiplies


def cycles(nest: LoopNest, machine: MachineModel, threads: int = 1) -> float:
    """Estimated cycles of one run of `nest` on `machine` with `threads` threads (the
    busiest thread's cycles, and the cost of opening parallel regions when threads > 1)."""
    tiles = {t.name: t for t in nest.tiles}
    ways = max(1, machine.caches[0] // SET_PERIOD) if machine.caches[0] else 8
    restream = _restreamed(nest.body, (), tiles, nest.lanes, threads)
    keeps = 0.75 * (machine.caches[1] or 1 << 20)
    ctx = (threads, ways, machine.a_streams, machine.stream_wait)
    compute = _cycles(nest.body, tiles, machine.unit(nest.lanes), ctx) + \
        sum(max(0.0, passes - 1) * size for passes, size in restream if size > keeps) \
        / (RESTREAM_OVERLAP * machine.l3_bytes_per_cycle)
    return compute + _weight_bytes(nest, threads) / machine.dram_bytes_per_cycle


def _weight_bytes(nest: LoopNest, threads: int) -> float:
    """Bytes of the weights (the B operand of outer-product updates and AMX products)
    read from memory: once, or once per thread where the parallel loop around an update
    shares out a variable their index does not use."""
    sizes = {b.name: 4 * b.size for b in nest.buffers}
    most = 0.0

    def walk(body, shared: str | None) -> None:
        nonlocal most
        for s in body:
            if isinstance(s, For):
                split = s.body[0] if s.body and isinstance(s.body[0], Split) else None
                first = split.names[0] if split is not None else s.var
                walk(s.body, first if s.kind == PARALLEL else shared)
            elif isinstance(s, UpdateTile) and s.mode == BCAST_FMA and s.b is not None \
                    or isinstance(s, AmxGemm):
                indexed = {v for v, c in s.b.index.terms if c}
                copies = 1 if shared is None or shared in indexed else threads
                most = max(most, sizes.get(s.b.buffer, 0) * copies)
    walk(nest.body, None)
    return most


def _restreamed(body, path: tuple, tiles: dict, lanes: int, threads: int) -> list:
    """(passes, bytes) per operand of each tile update: how many times the loops outside
    the outermost loop that does not index it repeat the part of it the loops inside that
    one touch, and that part's size. `path`: the enclosing loops as (var, extent), fused
    parallel loops as their digits, the outermost shared out over `threads`."""
    out = []
    for s in body:
        if isinstance(s, For):
            digits = ((s.var, s.extent),)
            if s.body and isinstance(s.body[0], Split) and s.body[0].var == s.var:
                digits = tuple(zip(s.body[0].names, s.body[0].extents))
            if s.kind == PARALLEL:
                digits = ((digits[0][0], -(-digits[0][1] // threads)),) + digits[1:]
            out += _restreamed(s.body, path + digits, tiles, lanes, threads)
        elif isinstance(s, UpdateTile) and s.mode == BCAST_FMA and s.b is not None:
            tile = tiles[s.tile]
            per_update = ((s.a, 4 * tile.shape[0] * tile.shape[1]),
                          (s.b, 4 * tile.vecs * lanes))
            out += [_passes(path, {v for v, c in acc.index.terms if c}, size)
                    for acc, size in per_update]
    return out


def _passes(path: tuple, indexed: set, size: int) -> tuple[int, int]:
    for i, (var, _) in enumerate(path):
        inner = path[i + 1:]
        if var not in indexed and any(v in indexed for v, _ in inner):
            passes = 1
            for _, extent in path[: i + 1]:
                passes *= extent
            for v, extent in inner:
                size *= extent if v in indexed else 1
            return passes, size
    return 1, 0


def _cycles(body, tiles: dict, u: VectorUnit, ctx: tuple) -> float:
    """ctx: (threads, L1 ways, the machine's a_streams and stream_wait)."""
    total = 0.0
    for s in body:
        if isinstance(s, For):
            loop = 0.0 if s.kind == UNROLL else LOOP_CYCLES
            extent, threads = s.extent, ctx[0]
            if s.kind == PARALLEL and threads > 1:
                extent = -(-extent // threads)
                total += FORK_CYCLES
            total += extent * (_cycles(s.body, tiles, u, ctx) + loop)
        elif isinstance(s, UpdateTile):
            total += _update_cycles(s, tiles[s.tile], u, *ctx[1:])
        elif isinstance(s, ZeroTile):
            total += _accumulators(tiles[s.tile]) / u.fma_per_cycle
        elif isinstance(s, StoreTile):
            total += _accumulators(tiles[s.tile]) * (1 + len(s.epilogue))
        elif isinstance(s, AmxGemm):
            per_step = max(s.mt * s.nt * AMX_DOT_CYCLES, (s.mt + s.nt) * AMX_LOAD_CYCLES)
            total += len(s.taps) * s.steps * (per_step + LOOP_CYCLES) \
                + s.mt * s.nt * (AMX_DOT_CYCLES + s.accumulate * AMX_LOAD_CYCLES)
        elif isinstance(s, Reduce):
            ops, loads = _expr_cost(s.expr)
            per_step = max((ops + 1) / u.fma_per_cycle, loads / u.loads_per_cycle,
                           u.fma_latency / s.accs)
            # a partial last vector costs a whole one; then the lanes are combined
            total += (s.extent + bool(s.tail)) * per_step + u.fma_latency * 3
        elif isinstance(s, (Map, MapGroup)):
            ops, loads = _expr_cost(s.expr) if isinstance(s, Map) else \
                _exprs_cost(tuple(e for _, e in s.outs), shared=True)
            total += (s.extent + bool(s.tail)) * (  # a partial last vector: a whole one
                max(ops / u.fma_per_cycle, loads / u.loads_per_cycle, 1.0) + LOOP_CYCLES)
    return total


@functools.lru_cache(maxsize=4096)  # the same stages recur in thousands of ranked configs
def _exprs_cost(exprs: tuple, shared: bool) -> tuple[float, int]:
    """(vector ops, vector loads) of evaluating `exprs`; with `shared`, each distinct
    subexpression once (as a MapGroup renders them), else every occurrence (as Map and
    Reduce do)."""
    seen: set = set()
    ops, loads = 0.0, 0

    def visit(e) -> None:
        nonlocal ops, loads
        if shared:
            if e in seen:
                return
            seen.add(e)
        if isinstance(e, Ld):
            loads += 1
        elif isinstance(e, Bin):
            visit(e.x)
            visit(e.y)
            ops += 1
        elif isinstance(e, Un):
            visit(e.x)
            ops += 1 if e.op in CHEAP_OPS else TRANSCENDENTAL_OPS
        # scalars, registers and numbers are broadcast once, outside the loop
    for e in exprs:
        visit(e)
    return ops, loads


def _expr_cost(e) -> tuple[float, int]:
    """(vector ops, vector loads) of one evaluation of a row expression."""
    return _exprs_cost((e,), shared=False)


def _accumulators(tile) -> int:
    return tile.shape[0] * tile.shape[1] * tile.vecs


def _update_cycles(s: UpdateTile, tile, u: VectorUnit, ways: int, streams: int,
                   wait: float) -> float:
    accs = _accumulators(tile)
    if s.mode == BCAST_FMA:
        loads = tile.shape[0] * tile.shape[1] + tile.vecs
    elif s.mode == VEC_FMA:
        loads = 2 * accs
    else:  # max, add, set: one vector of A per accumulator
        loads = accs
    offsets = tuple(tile.offsets(s.a_strides))
    misses = _conflict_lines(offsets, ways) * MISS_CYCLES
    waits, b_lines = 0.0, 0.0
    if s.mode == BCAST_FMA:
        waits = max(0, _streams(offsets) - streams) * wait
        b_lines = tile.vecs * u.lanes * 4 / L2_BYTES_PER_CYCLE
    return max(accs / u.fma_per_cycle, loads / u.loads_per_cycle, u.fma_latency,
               misses, b_lines) + waits


def _streams(offsets: tuple[int, ...]) -> int:
    """Runs of adjacent lines among the tile's A elements: a conv's tile columns read one
    run, a GEMM's tile rows (K apart) one run each."""
    lines = sorted({off * 4 // LINE for off in offsets})
    return 1 + sum(1 for x, y in zip(lines, lines[1:]) if y > x + 1)


@functools.lru_cache(maxsize=4096)
def _conflict_lines(offsets: tuple[int, ...], ways: int) -> int:
    """A lines of one update (element offsets of the tile's rows) that fall in L1 sets
    holding more of them than the ways left beside B's and the output's lines (two)."""
    sets: dict[int, set[int]] = {}
    for off in offsets:
        line = off * 4 // LINE
        sets.setdefault(line % (SET_PERIOD // LINE), set()).add(line)
    return sum(len(lines) for lines in sets.values() if len(lines) > ways - 2)
