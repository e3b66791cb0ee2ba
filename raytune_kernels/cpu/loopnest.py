"""A small loop-nest IR (pure data) and its numpy interpreter, the executable definition.

Kernels are register-tiled: an accumulator tile of rows x `vecs` vectors of `lanes` floats
is initialised, updated inside reduction loops, then finished by a fused epilogue and
stored. An update is an outer product (a broadcast scalar of A per row times a vector of B:
conv, dense, matmul), an elementwise product of vectors (depthwise conv), a max or a sum
of A vectors (pooling), or a plain load of A (layout transforms, elementwise tasks). Row
statements (Reduce, Let, Map, MapGroup) evaluate vector expressions of loads. Indices are
affine in loop variables, counted in float elements; a `Split` statement decomposes a fused
loop variable into digits (how parallel loops are fused).
"""
from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Union

import numpy as np

SERIAL, PARALLEL, UNROLL = "serial", "parallel", "unroll"


@dataclass(frozen=True)
class Affine:
    """sum(coef * var) + const."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    def plus(self, var: str, coef: int) -> "Affine":
        return Affine(self.terms + ((var, coef),), self.const) if coef else self

    def offset(self, k: int) -> "Affine":
        return Affine(self.terms, self.const + k)

    def eval(self, env: dict[str, int]) -> int:
        return self.const + sum(c * env[v] for v, c in self.terms)


def affine(*terms: tuple[str, int], const: int = 0) -> Affine:
    return Affine(tuple(t for t in terms if t[1]), const)


@dataclass(frozen=True)
class Access:
    buffer: str
    index: Affine


@dataclass(frozen=True)
class For:
    var: str
    extent: int
    kind: str
    body: tuple["Stmt", ...]


@dataclass(frozen=True)
class Split:
    """Define `names` as the mixed-radix digits (most significant first) of `var`."""

    var: str
    names: tuple[str, ...]
    extents: tuple[int, ...]


@dataclass(frozen=True)
class ZeroTile:
    """Set every accumulator of the tile to `value` (0, or -inf before a max)."""

    tile: str
    value: float = 0.0


BCAST_FMA, VEC_FMA, MAX, ADD, SET = "bcast_fma", "vec_fma", "max", "add", "set"


@dataclass(frozen=True)
class UpdateTile:
    """Update acc[i, j, v] with A at a.index + i*a_strides[0] + j*a_strides[1] and B.

    bcast_fma: acc += splat(A scalar) * B[b.index + v*lanes]   (outer product)
    vec_fma:   acc += A[... + v*lanes] * B[b.index + v*lanes]  (elementwise product)
    max / add: acc = max(acc, A[... + v*lanes]) / acc + A[...]
    set:       acc = A[... + v*lanes]
    The tile is 2-D in (i, j) (e.g. output rows x columns) times `vecs` vectors.

    With `prefetch` (elements), each cache line of the B vectors is also requested that
    far ahead of where they are read: a hint with no effect on the result, for a B that
    streams from memory (a large layer's weights, read once per call)."""

    tile: str
    a: Access
    a_strides: tuple[int, int]
    b: Access | None = None
    mode: str = BCAST_FMA
    prefetch: int = 0


@dataclass(frozen=True)
class EpiStep:
    """An epilogue op on the tile. Operands are vectors at index + i*s0 + j*s1 + v*lanes."""

    op: str
    operands: tuple[tuple[Access, tuple[int, int]], ...] = ()
    scalar: float | None = None
    reverse: bool = False


@dataclass(frozen=True)
class StoreTile:
    """out[out.index + i*s0 + j*s1 + v*lanes : +lanes] = epilogue(acc[i, j, v]).

    With `bf16`, each vector is rounded to bfloat16 (to nearest, ties to even) and stored
    whole, a masked tile's dead lanes as well (they hold what its masked loads read, 0),
    as lanes/2 four-byte slots of two values each, first value in the low half: the
    index, the strides and the vector offsets (v*lanes/2) then count slots.

    With `pairs` as well, rows are taken two at a time (the tile's rows 2r and 2r+1, as
    two rows of the reduction) and interleaved value by value: slot j of vector v holds
    row 2r's lane j in its low half and row 2r+1's in its high half (the dot product's
    VNNI order), lanes slots at (row 2r's offset) + v*lanes; an odd last row pairs with
    zeros."""

    tile: str
    out: Access
    out_strides: tuple[int, int]
    epilogue: tuple[EpiStep, ...] = ()
    bf16: bool = False
    pairs: bool = False


AMX_ROWS, AMX_STEP = 16, 32  # an AMX tile's rows; bf16 values of one dot-product step


@dataclass(frozen=True)
class AmxGemm:
    """C = A x B on AMX tensor tiles (amx-bf16), float32 accumulation, C stored to memory.

    A is len(`rows`) tiles, tile i of rows[i] <= 16 rows of bf16 pairs (`a_row` slots
    apart, a 4-byte slot holding two values; tile i starts i*`a_tile` slots after a), B is
    `nt` tiles packed for the dot product (VNNI: per step, 16 rows of pairs of the
    reduction by 16 columns, 256 slots; `b_tile` slots between tiles), over `steps` steps
    of 32 reduction values (16 slots of A, 256 of B each) from each of the `taps`: slot
    offsets of A added in turn (a convolution's (kh, kw) read straight from its input; one
    tap, 0, for a workspace of whole receptive fields), B's steps following on. C tile
    (i, j), rows[i] rows of 16 floats, lands at c.index + (i*nt + j)*256, rows 16 floats
    apart. With `accumulate`, the products add to the C tiles already there (a reduction
    walked in chunks) instead of starting from zero."""

    a: Access
    a_row: int
    a_tile: int
    rows: tuple[int, ...]
    b: Access
    b_tile: int
    steps: int
    nt: int
    c: Access
    taps: tuple[int, ...] = (0,)
    accumulate: bool = False

    @property
    def mt(self) -> int:
        return len(self.rows)


# ---- row kernels (softmax, layer norm, elementwise): vector expressions over a row ----

@dataclass(frozen=True)
class Ld:
    """A vector of `lanes` floats at an access (its index includes the row loop's var)."""

    access: Access


@dataclass(frozen=True)
class LdScalar:
    """One float, broadcast to every lane."""

    access: Access


@dataclass(frozen=True)
class Reg:
    """A scalar register set by Reduce or Let, broadcast where a vector is needed."""

    name: str


@dataclass(frozen=True)
class Num:
    value: float


class _SharedNode:
    """An expression node whose hash is computed once. Expressions are DAGs (the
    Winograd transforms share their row sums), and a dataclass hash walks the whole tree
    on every set or dict lookup: ranking a search's candidates spent most of its time
    rehashing the same subtrees. The cached hash is left out of pickles: string hashes
    differ between processes."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((type(self).__name__, *(getattr(self, f) for f in self._fields)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True)
class Bin(_SharedNode):
    op: str  # add, sub, mul, div, max
    x: "Expr"
    y: "Expr"
    _fields = ("op", "x", "y")
    __hash__ = _SharedNode.__hash__


@dataclass(frozen=True)
class Un(_SharedNode):
    op: str  # exp, sqrt, relu, relu6, sigmoid, tanh, silu, gelu, gelu_tanh
    x: "Expr"
    _fields = ("op", "x")
    __hash__ = _SharedNode.__hash__


Expr = Union[Ld, LdScalar, Reg, Num, Bin, Un]


@dataclass(frozen=True)
class Reduce:
    """reg = op over var in [0, extent) of expr (vectors), then across lanes: sum or max.
    `accs` independent vector accumulators hide the add latency (extent % accs == 0).
    With `tail`, one more step at var = extent whose first `tail` lanes count (its loads
    read nothing past them): a row no vector divides."""

    reg: str
    op: str
    expr: Expr
    var: str
    extent: int
    accs: int = 1
    tail: int = 0


@dataclass(frozen=True)
class Let:
    """reg = expr, a scalar expression of registers and numbers."""

    reg: str
    expr: Expr


@dataclass(frozen=True)
class Map:
    """For var in [0, extent): store the vector expr at out (whose index includes var);
    `scalar`: store only its first lane (a reduction's one value per row). With `tail`,
    one more step at var = extent that reads and writes its first `tail` lanes only."""

    out: Access
    expr: Expr
    var: str
    extent: int
    scalar: bool = False
    tail: int = 0


@dataclass(frozen=True)
class MapGroup:
    """For var in [0, extent): store each expr at its out, every store of the group from
    one evaluation: a subexpression shared by several exprs (an equal object) is computed
    once per iteration, as the separable Winograd transforms share their row sums. The
    exprs must not read a buffer the group writes."""

    outs: tuple[tuple[Access, "Expr"], ...]
    var: str
    extent: int
    tail: int = 0  # as Map's

    def __post_init__(self) -> None:
        written = {out.buffer for out, _ in self.outs}
        read = {b for _, e in self.outs for b in loaded_buffers(e)}
        if written & read:
            raise ValueError(f"MapGroup reads what it writes: {sorted(written & read)}")


def loaded_buffers(e) -> set[str]:
    """The buffers an expression loads from (each shared subexpression visited once)."""
    out: set[str] = set()
    seen: set[int] = set()
    stack = [e]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (Ld, LdScalar)):
            out.add(e.access.buffer)
        elif isinstance(e, Bin):
            stack += (e.x, e.y)
        elif isinstance(e, Un):
            stack.append(e.x)
    return out


Stmt = Union[For, Split, ZeroTile, UpdateTile, StoreTile, AmxGemm, Reduce, Let, Map,
             MapGroup]


@dataclass(frozen=True)
class Tile:
    """rows x `vecs` vectors of accumulators; with `mask`, only the first `mask` lanes of
    each row's last vector are live (a vector axis that no vector width divides): its
    loads and stores are masked, so nothing past the axis is read or written."""

    name: str
    shape: tuple[int, int]
    vecs: int
    mask: int = 0

    @property
    def rows(self) -> int:
        return self.shape[0] * self.shape[1]

    def width(self, lanes: int) -> int:
        """The live floats of a tile row."""
        return (self.vecs - 1) * lanes + self.mask if self.mask else self.vecs * lanes

    def offsets(self, strides: tuple[int, int]) -> list[int]:
        """Element offset of each tile row (i, j), row-major, for the given strides."""
        return [i * strides[0] + j * strides[1]
                for i in range(self.shape[0]) for j in range(self.shape[1])]


@dataclass(frozen=True)
class Buffer:
    name: str
    size: int
    role: str  # "in", "out", or "scratch" (a workspace: nothing in, nothing kept)


@dataclass(frozen=True)
class LoopNest:
    """A whole kernel: its buffers (the C arguments, in order), tiles and statements."""

    name: str
    buffers: tuple[Buffer, ...]
    tiles: tuple[Tile, ...]
    body: tuple[Stmt, ...]
    lanes: int

    def tile(self, name: str) -> Tile:
        return next(t for t in self.tiles if t.name == name)


# ---- interpreter ----

UNARY_NP = {
    "relu": lambda x: np.maximum(x, 0.0), "relu6": lambda x: np.clip(x, 0.0, 6.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "tanh": np.tanh,
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3))),
    "hardsigmoid": lambda x: np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "hardswish": lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "mish": lambda x: x * np.tanh(np.logaddexp(0.0, x)), "exp": np.exp,
    "erf": np.vectorize(math.erf), "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "square": np.square, "neg": np.negative, "abs": np.abs,
    "softplus": lambda x: np.logaddexp(0.0, x),
}
BINARY_NP = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
             "maximum": np.maximum, "minimum": np.minimum,
             "prelu": lambda x, a: np.where(x >= 0, x, a * x),
             "elu": lambda x, a: np.where(x > 0, x, a * np.expm1(np.minimum(x, 0.0)))}


def apply_epilogue_np(step: EpiStep, acc: np.ndarray, operands: list[np.ndarray]) -> np.ndarray:
    if step.op in UNARY_NP:
        return UNARY_NP[step.op](acc)
    if step.op == "affine":
        return acc * operands[0] + operands[1]
    other = operands[0] if operands else np.float32(step.scalar)
    return BINARY_NP[step.op](other, acc) if step.reverse else BINARY_NP[step.op](acc, other)


def interpret(nest: LoopNest, buffers: dict[str, np.ndarray]) -> None:
    """Run `nest` on flat float32 arrays (outputs written in place). Slow: for tests."""
    accs = {t.name: np.zeros((t.rows, t.vecs * nest.lanes), np.float32) for t in nest.tiles}
    _run(nest, nest.body, {}, buffers, accs)


_EXPR_UNARY = {"exp": np.exp, "sqrt": np.sqrt}
_EXPR_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                "max": np.maximum, "min": np.minimum}


def _eval(nest: LoopNest, e, env: dict, bufs, live: int = 0) -> np.ndarray:
    """A row expression's vector; with `live`, its loads read their first `live` lanes
    (the rest read as 0), as a row's tail step does."""
    if isinstance(e, Ld):
        i = e.access.index.eval(env)
        if live:
            out = np.zeros(nest.lanes, np.float32)
            out[:live] = bufs[e.access.buffer][i: i + live]
            return out
        return bufs[e.access.buffer][i: i + nest.lanes].astype(np.float32)
    if isinstance(e, LdScalar):
        return np.float32(bufs[e.access.buffer][e.access.index.eval(env)])
    if isinstance(e, Reg):
        return env["%" + e.name]
    if isinstance(e, Num):
        return np.float32(e.value)
    if isinstance(e, Bin):
        return _EXPR_BINARY[e.op](_eval(nest, e.x, env, bufs, live),
                                  _eval(nest, e.y, env, bufs, live))
    x = _eval(nest, e.x, env, bufs, live)
    fn = _EXPR_UNARY.get(e.op) or UNARY_NP[e.op]
    return np.asarray(fn(x), np.float32)


def _steps(s) -> list[tuple[int, int]]:
    """(var's value, live lanes: 0 for all) of a row statement's steps, its tail last."""
    return [(j, 0) for j in range(s.extent)] + ([(s.extent, s.tail)] if s.tail else [])


def _row_stmt(nest: LoopNest, s, env: dict, bufs) -> None:
    if isinstance(s, Let):
        env["%" + s.reg] = np.float32(_eval(nest, s.expr, env, bufs))
    elif isinstance(s, Reduce):
        parts = []
        for j, live in _steps(s):
            env[s.var] = j
            value = np.broadcast_to(_eval(nest, s.expr, env, bufs, live), (nest.lanes,))
            parts.append(value[:live] if live else value)
        whole = np.concatenate(parts)
        env["%" + s.reg] = np.float32(whole.sum() if s.op == "sum" else whole.max())
    elif isinstance(s, MapGroup):
        for j, live in _steps(s):
            env[s.var] = j
            values = [np.broadcast_to(_eval(nest, e, env, bufs, live), (nest.lanes,))
                      for _, e in s.outs]
            for (out, _), value in zip(s.outs, values):
                i, n = out.index.eval(env), live or nest.lanes
                bufs[out.buffer][i: i + n] = value[:n]
    else:
        for j, live in _steps(s):
            env[s.var] = j
            i = s.out.index.eval(env)
            value = np.broadcast_to(_eval(nest, s.expr, env, bufs, live), (nest.lanes,))
            if s.scalar:
                bufs[s.out.buffer][i] = value[0]
            else:
                n = live or nest.lanes
                bufs[s.out.buffer][i: i + n] = value[:n]


def _run(nest: LoopNest, body, env, bufs, accs) -> None:
    for s in body:
        if isinstance(s, For):
            for i in range(s.extent):
                env[s.var] = i
                _run(nest, s.body, env, bufs, accs)
        elif isinstance(s, Split):
            _split(s, env)
        elif isinstance(s, ZeroTile):
            accs[s.tile][:] = s.value
        elif isinstance(s, UpdateTile):
            _update(nest, s, env, bufs, accs[s.tile], nest.tile(s.tile))
        elif isinstance(s, StoreTile):
            _store(nest, s, env, bufs, accs[s.tile], nest.tile(s.tile))
        elif isinstance(s, AmxGemm):
            _amx_gemm(s, env, bufs)
        else:
            _row_stmt(nest, s, env, bufs)


def _split(s: Split, env: dict) -> None:
    rest = env[s.var]
    for name, extent in reversed(list(zip(s.names, s.extents))):
        env[name], rest = rest % extent, rest // extent


def _gather(nest: LoopNest, access: Access, strides, tile: Tile, env, bufs) -> np.ndarray:
    """The tile's rows of vectors at `access`; lanes past a masked tile's width read 0."""
    base = access.index.eval(env)
    rows = np.array(tile.offsets(strides))[:, None]
    out = np.zeros((tile.rows, tile.vecs * nest.lanes), np.float32)
    live = tile.width(nest.lanes)
    out[:, :live] = bufs[access.buffer][base + rows + np.arange(live)[None, :]]
    return out


def _update(nest: LoopNest, s: UpdateTile, env, bufs, acc: np.ndarray, tile: Tile) -> None:
    if s.mode == BCAST_FMA:
        a = bufs[s.a.buffer][s.a.index.eval(env) + np.array(tile.offsets(s.a_strides))][:, None]
    else:
        a = _gather(nest, s.a, s.a_strides, tile, env, bufs)
    if s.mode in (BCAST_FMA, VEC_FMA):
        b0, live = s.b.index.eval(env), tile.width(nest.lanes)
        b = np.zeros(acc.shape[1], np.float32)
        b[:live] = bufs[s.b.buffer][b0: b0 + live]
        acc += a * b[None, :]
    elif s.mode == MAX:
        np.maximum(acc, a, out=acc)
    elif s.mode == ADD:
        acc += a
    else:
        acc[:] = a


def _store(nest: LoopNest, s: StoreTile, env, bufs, acc: np.ndarray, tile: Tile) -> None:
    value = acc.copy()
    for step in s.epilogue:
        ops = [_gather(nest, a, st, tile, env, bufs) for a, st in step.operands]
        value = apply_epilogue_np(step, value, ops).astype(np.float32)
    base, live = s.out.index.eval(env), tile.width(nest.lanes)
    rows = np.array(tile.offsets(s.out_strides))[:, None]
    if s.pairs:  # rows 2r and 2r+1 interleaved, a slot of two bf16 values per lane
        whole = tile.vecs * nest.lanes
        halves = bufs[s.out.buffer].view(np.uint16)
        for r in range(0, tile.rows, 2):
            high = value[r + 1, :whole] if r + 1 < tile.rows else np.zeros(whole, np.float32)
            both = np.stack([value[r, :whole], high], axis=-1).ravel()
            at = 2 * (base + int(rows[r, 0]))
            halves[at: at + 2 * whole] = to_bf16(both)
        return
    if s.bf16:  # slots of two bf16 values, whole vectors: write the 16-bit halves
        whole = tile.vecs * nest.lanes
        halves = bufs[s.out.buffer].view(np.uint16)
        halves[2 * (base + rows) + np.arange(whole)[None, :]] = to_bf16(value)
        return
    bufs[s.out.buffer][base + rows + np.arange(live)[None, :]] = value[:, :live]


def to_bf16(x: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (uint16) of float32 `x`, rounded to nearest, ties to even, as
    vcvtneps2bf16 rounds (NaNs stay NaN)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def from_bf16(h: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bits (uint16)."""
    return (h.astype(np.uint32) << 16).view(np.float32)


def _amx_gemm(s: AmxGemm, env, bufs) -> None:
    """C = A x B in float32 from the bf16 operands (the order of the sums may differ from
    the hardware's, within float32 rounding)."""
    k = len(s.taps) * s.steps * AMX_STEP
    a0 = s.a.index.eval(env)
    a_half = bufs[s.a.buffer].view(np.uint16)
    starts = [a0 + i * s.a_tile + r * s.a_row for i, m in enumerate(s.rows) for r in range(m)]
    cols = np.concatenate([2 * t + np.arange(s.steps * AMX_STEP) for t in s.taps])
    a = from_bf16(a_half[2 * np.array(starts)[:, None] + cols[None, :]])
    b_half = bufs[s.b.buffer].view(np.uint16)
    b0 = s.b.index.eval(env)
    c0 = s.c.index.eval(env)
    out = bufs[s.c.buffer]
    for j in range(s.nt):
        start = 2 * (b0 + j * s.b_tile)
        # per step: [16 pairs][16 columns][2] -> the step's 32 x 16 block of B
        steps = len(s.taps) * s.steps
        blocks = b_half[start: start + steps * 512].reshape(steps, 16, 16, 2)
        b = from_bf16(blocks.transpose(0, 1, 3, 2).reshape(k, 16))
        c = a.astype(np.float64) @ b.astype(np.float64)
        first = 0
        for i, m in enumerate(s.rows):
            at = c0 + (i * s.nt + j) * 256
            got = c[first: first + m].astype(np.float32).reshape(-1)
            if s.accumulate:
                got = out[at: at + 16 * m] + got
            out[at: at + 16 * m] = got
            first += m
