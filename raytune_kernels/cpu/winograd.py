"""Winograd F(m x m, 3x3), m = 2 or 4: the third algorithm for 3x3 stride-1 convolutions,
chosen by measurement like im2col (algorithms "winograd" and "winograd4").

Each m x m block of outputs (a tile t) needs an a x a window d (a = m + 2) of the
(bordered) input, and Y = A^T [ sum_c (G g G^T) (.) (B^T d B) ] A: a^2 products per tile
and channel pair instead of 9 m^2. F(2x2) does 16 for 36 (2.25x fewer multiplies) with
transforms of +-1 and 1/2; F(4x4) does 36 for 144 (4x fewer), and its workspaces hold
2.25 values per output instead of 4, paid for with larger transforms (coefficients up to
25) and larger float32 errors: on ResNet-18's layers, 4e-6 to 9e-6 of the output's largest
magnitude against F(2x2)'s 2e-7 to 5e-7 and the direct conv's 6e-7 to 1.4e-6.

- Stage 1 (input transform, parallel over channel blocks x tile rows): V[xi][t][c] =
  (B^T d B)[xi] for every tile and channel, vectors along the channel block (the input is
  the direct conv's bordered [C/CB][Hp][Wp][CB], so its layouts and labels are the same).
- Stage 2 (a^2 GEMMs, register-tiled like im2col's):
  M[xi][t][k] = sum_c V[xi][t][c] U[xi][c][k], with U = G g G^T packed once as
  [a^2][K/OB][C][OB] (a constant, like every packed weight).
- Stage 3 (output transform and the fused epilogue, parallel over output-channel blocks x
  tile rows): Y = A^T M A for each tile, written in the direct conv's output layouts,
  into its reader's bordered buffer where the plan asks (out_pad, as the direct conv).
V and M are workspaces (kernel buffers "v", "m"; in a compiled network, values of their
step that the arena holds like any other, compile/cpu_plan.allocate). Where m does not
divide a side of the output (ResNet's 7x7 maps), the last tile row or column is ragged:
the transforms run over up to four rectangles of tiles (whole tiles, the last column, the
last row, the corner): the input windows' rows and columns past the padded input are
zeros, not loads (the conv of a zero-extended input, equal to the conv itself within its
edge), and the outputs past the edge are not stored. It applies where the tiles cover at
most half again as many outputs as the conv has. The tests hold built kernels of both to
the reference within 1e-4, as for the direct conv, and the measurer checks every
candidate the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
import functools
import itertools
import math
from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.cpu.machine import CpuInfo
from raytune_kernels.task import Compute
from raytune_kernels.cpu.contraction import Conv2dContraction
from raytune_kernels.cpu.contraction_base import residual_cfg
from raytune_kernels.cpu.im2col import gemm_outer, tile_variants, gemm_combos
from raytune_kernels.cpu.loopnest import (BCAST_FMA, PARALLEL, SERIAL, UNROLL, Access, Affine, Bin,
                                          Buffer, For, Ld, LoopNest, MapGroup, Num, Split,
                                          StoreTile, Tile, UpdateTile, ZeroTile)
from raytune_kernels.cpu.lower import operand_kinds, pack_operands
from raytune_kernels.cpu.row_kernels import epilogue_expr
from raytune_kernels.space import Space

if TYPE_CHECKING:
    import torch

@dataclass(frozen=True)
class Variant:
    """F(m x m, 3x3): output tiles of m x m from input windows of a x a, a = m + 2, with
    Y = A^T [(G g G^T) (.) (B^T d B)] A (Lavin and Gray's matrices: points 0, +-1, +-2
    and infinity for m = 4)."""

    m: int
    bt: tuple  # B^T, a x a
    g: tuple  # G, a x 3
    at: tuple  # A^T, m x a

    @property
    def a(self) -> int:
        return self.m + 2

    @property
    def xi(self) -> int:  # transformed positions
        return self.a * self.a


F2 = Variant(2, ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
             ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0)),
             ((1, 1, 1, 0), (0, 1, -1, -1)))
F4 = Variant(4, ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
                 (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
             ((1 / 4, 0.0, 0.0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6),
              (1 / 24, 1 / 12, 1 / 6), (1 / 24, -1 / 12, 1 / 6), (0.0, 0.0, 1.0)),
             ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0),
              (0, 1, -1, 8, -8, 1)))
VARIANTS = {"winograd": F2, "winograd4": F4}  # the knob `algorithm`'s value -> variant


def variant(cfg) -> Variant:
    return VARIANTS[cfg.get("algorithm", "winograd")]


RAGGED_WASTE = 1.5  # most outputs the tiles may cover, per output the conv has


def tile_grid(oh: int, ow: int, m: int) -> tuple[int, int]:
    """Rows and columns of m x m tiles covering an oh x ow output (the last ones ragged
    where m does not divide a side)."""
    return -(-oh // m), -(-ow // m)


def tile_count(con: Conv2dContraction, v: Variant) -> int:
    """The m x m tiles covering the conv's output: the GEMMs' rows, V's and M's tiles."""
    return math.prod(tile_grid(con.oh, con.ow, v.m))


def applicable(c: Compute, v: Variant = F2) -> bool:
    """3x3, stride 1, no dilation, one group, batch 1, channel counts that fill vectors,
    and tiles covering at most RAGGED_WASTE times the output's area."""
    if c.op != "conv2d" or c.attr("groups") != 1 or c.inputs[0].shape[0] != 1:
        return False
    _, ch, _, _ = c.inputs[0].shape
    k, _, kh, kw = c.inputs[1].shape
    _, _, oh, ow = c.output.shape
    return ((kh, kw) == (3, 3) and tuple(c.attr("stride")) == (1, 1)
            and tuple(c.attr("dilation")) == (1, 1) and ch % 8 == 0 and k % 8 == 0
            and math.prod(tile_grid(oh, ow, v.m)) * v.m * v.m <= RAGGED_WASTE * oh * ow)


def winograd_space(c: Compute, cpu: CpuInfo, v: Variant = F2) -> Space:
    con = Conv2dContraction.from_compute(c)
    combos = gemm_combos(con, tile_count(con, v), cpu, whole_c=True)
    independent = (("out_layout", con.out_layouts),
                   ("spatial_order", tuple(itertools.permutations(("xi", "ko", "pt")))),
                   ("parallel", (1, 2)))
    return Space(("lanes", "ob", "tile_h", "cb"), tuple(combos), independent)


def _weighted_sum(terms: list[tuple[float, object]]):
    """sum(coef * x): adds and subtracts of x or |coef| * x (a positive term first); an
    x of None is a zero (a window position past the input's edge), and a sum of zeros
    is None."""
    terms = sorted(((c, x) for c, x in terms if x is not None), key=lambda t: -t[0])
    if not terms:
        return None

    def scaled(coef, x):
        return x if abs(coef) == 1 else Bin("mul", Num(float(abs(coef))), x)
    coef, x = terms[0]
    value = scaled(coef, x) if coef > 0 else Bin("sub", Num(0.0), scaled(coef, x))
    for coef, x in terms[1:]:
        value = Bin("add" if coef > 0 else "sub", value, scaled(coef, x))
    return value


def lower_winograd(c: Compute, cfg) -> LoopNest:
    con, v = Conv2dContraction.from_compute(c), variant(cfg)
    lanes, cb, ob = cfg["lanes"], cfg["cb"], cfg["ob"]
    if not applicable(c, v):
        raise ValueError(f"winograd F({v.m}x{v.m}, 3x3) does not apply to {c.describe()}")
    if cb % lanes or con.c % cb or ob % lanes or con.k % ob:
        raise ValueError(f"winograd: cb={cb} and ob={ob} must divide C={con.c} and "
                         f"K={con.k} and be multiples of lanes={lanes}")
    tiles = tile_count(con, v)
    kinds = operand_kinds(c)
    sizes = con.buffer_sizes(cfg)
    bufs = [Buffer("a", sizes["a"], "in"), Buffer("b", v.xi * con.c * con.k, "in")]
    res_size = con.buffer_sizes(residual_cfg(cfg))["out"]
    bufs += [Buffer(f"e{i}", con.k if k.kind == "channel" else res_size, "in")
             for i, k in enumerate(kinds)]
    bufs += [Buffer("out", sizes["out"], "out"),
             Buffer("v", v.xi * tiles * con.c, "scratch"),
             Buffer("m", v.xi * tiles * con.k, "scratch")]
    tile_list: list[Tile] = []
    body = [*_input_stage(con, cfg, tiles, v), *_gemm_stage(con, cfg, tiles, tile_list, v),
            *_output_stage(c, con, cfg, tiles, kinds, v)]
    suffix = "winograd" if v.m == 2 else f"winograd{v.m}"
    return LoopNest(f"k_{c.key()}_{suffix}", tuple(bufs), tuple(tile_list), tuple(body),
                    lanes)


def _input_stage(con: Conv2dContraction, cfg, tiles: int, v: Variant):
    """V = B^T d B for every tile and channel vector, separably: the a x a column sums
    T = B^T d first, then each V[ksi][nu] from T's row ksi (a MapGroup computes each T
    entry once and each input vector is loaded once)."""
    return _input_stage_of(con, cfg["lanes"], cfg["cb"], tiles, v)


# The stages are pure functions of a few config entries, and ranking a search's
# candidates lowers thousands of configs that share them (building the transforms'
# expressions was a third of a proposal's time): each is built once per process.
@functools.lru_cache(maxsize=512)
def _input_stage_of(con: Conv2dContraction, lanes: int, cb: int, tiles: int, v: Variant):
    m, a = v.m, v.a
    hp, wp = con.padded()
    cols = tile_grid(con.oh, con.ow, m)[1]
    stages = []
    for (r0, nr), (c0, nc) in _regions(con, m):
        last_row, last_col = (r0 + nr - 1) * m, (c0 + nc - 1) * m

        def d(i: int, j: int) -> Ld | None:
            if last_row + i >= hp or last_col + j >= wp:
                return None  # past the padded input: a zero, never loaded
            return Ld(Access("a", _terms((("cq", hp * wp * cb), ("ty", m * wp * cb, nr),
                                          ("tx", m * cb, nc), ("cv", lanes)),
                                         (i + r0 * m) * wp * cb + (j + c0 * m) * cb)))
        t = [[_weighted_sum([(v.bt[ksi][i], d(i, j)) for i in range(a) if v.bt[ksi][i]])
              for j in range(a)] for ksi in range(a)]
        outs = []
        for xi in range(v.xi):
            ksi, nu = divmod(xi, a)
            out = _terms((("cq", cb), ("ty", cols * con.c, nr), ("tx", con.c, nc),
                          ("cv", lanes)), xi * tiles * con.c + (r0 * cols + c0) * con.c)
            value = _weighted_sum([(v.bt[nu][j], t[ksi][j]) for j in range(a)
                                   if v.bt[nu][j]])
            outs.append((Access("v", out), Num(0.0) if value is None else value))
        stages.append(_tile_loops((("cq", con.c // cb), ("ty", nr)), ("tx", nc),
                                  MapGroup(tuple(outs), "cv", cb // lanes)))
    return tuple(stages)


def _regions(con: Conv2dContraction, m: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """((first tile row, tile rows), (first tile column, tile columns)) of the rectangles
    of tiles the transforms run over: the whole tiles, then the ragged last column, last
    row and corner where m does not divide a side."""
    def runs(n: int) -> list[tuple[int, int]]:
        whole = n // m
        return ([(0, whole)] if whole else []) + ([(whole, 1)] if n % m else [])
    return [(r, c) for r in runs(con.oh) for c in runs(con.ow)]


def _terms(terms: tuple, const: int) -> Affine:
    """An Affine of (variable, stride[, extent]) terms: a variable whose loop has one
    iteration is left out (its loop is not emitted)."""
    return Affine(tuple(t[:2] for t in terms if len(t) == 2 or t[2] > 1), const)


def _tile_loops(parallel: tuple, inner: tuple[str, int], body) -> For:
    """The parallel loop over the `parallel` (variable, extent) pairs fused (the channel
    block first, then the tile rows unless they are one, as _terms leaves them), around a
    serial loop over `inner` (unless it is one), around body."""
    var, extent = inner
    stmts = (For(var, extent, SERIAL, (body,)),) if extent > 1 else (body,)
    fused = parallel[:1] + tuple((n, e) for n, e in parallel[1:] if e > 1)
    names, extents = zip(*fused)
    return For("q", math.prod(extents), PARALLEL, (Split("q", names, extents),) + stmts)


def _gemm_stage(con: Conv2dContraction, cfg, tiles: int, tile_list: list, v: Variant
                ) -> list:
    ob, th, c, k = cfg["ob"], cfg["tile_h"], con.c, con.k
    unroll = max(d for d in range(1, 17) if c % d == 0)
    out = []
    for count, rows, offset in tile_variants(tiles, th):
        tile = Tile(f"g{len(tile_list)}", (rows, 1), ob // cfg["lanes"])
        tile_list.append(tile)
        live = {"xi": v.xi, "ko": k // ob, "pt": count}
        a = Affine((("xi", tiles * c), ("pt", rows * c), ("rq", unroll), ("ri", 1)),
                   offset * c)
        b = Affine((("xi", k * c), ("ko", c * ob), ("rq", unroll * ob), ("ri", ob)))
        o = Affine((("xi", tiles * k), ("ko", ob), ("pt", rows * k)), offset * k)
        update = UpdateTile(tile.name, Access("v", a), (c, 0), Access("b", b), BCAST_FMA)
        stmts = (ZeroTile(tile.name),
                 For("rq", c // unroll, SERIAL, (For("ri", unroll, UNROLL, (update,)),)),
                 StoreTile(tile.name, Access("m", o), (k, 0)))
        out.append(gemm_outer(cfg, live, stmts))
    return out


def _output_stage(c: Compute, con: Conv2dContraction, cfg, tiles: int, kinds, v: Variant):
    """Y = A^T M A for every tile and output-channel vector, separably (S = A^T M, then
    each output from S's row), then the fused epilogue, in one MapGroup."""
    # the direct conv's output layouts, in a bordered buffer where the plan gives one;
    # residuals in theirs (res_pad)
    rcfg = residual_cfg(cfg)
    return _output_stage_of(c, con, cfg["lanes"], cfg["ob"], con.out_steps(cfg),
                            con.out_offset(cfg), tiles, tuple(kinds), v,
                            con.out_steps(rcfg), con.out_offset(rcfg))


@functools.lru_cache(maxsize=512)
def _output_stage_of(c: Compute, con: Conv2dContraction, lanes: int, ob: int,
                     steps: tuple[int, int, int], start: int, tiles: int, kinds: tuple,
                     v: Variant, r_steps: tuple[int, int, int], r_start: int):
    k, m, a = con.k, v.m, v.a
    cols = tile_grid(con.oh, con.ow, m)[1]
    stages = []

    def at(steps: tuple[int, int, int], start: int, i: int, j: int, r0: int, c0: int,
           nr: int, nc: int) -> Affine:
        s_block, s_row, s_col = steps
        return _terms((("ko", s_block), ("ty", m * s_row, nr), ("tx", m * s_col, nc),
                       ("kv", lanes)),
                      (i + r0 * m) * s_row + (j + c0 * m) * s_col + start)
    for (r0, nr), (c0, nc) in _regions(con, m):
        def mv(xi: int) -> Ld:
            return Ld(Access("m", _terms((("ty", cols * k, nr), ("tx", k, nc), ("ko", ob),
                                          ("kv", lanes)),
                                         xi * tiles * k + (r0 * cols + c0) * k)))
        rows = [[_weighted_sum([(v.at[i][ksi], mv(ksi * a + nu)) for ksi in range(a)
                                if v.at[i][ksi]]) for nu in range(a)] for i in range(m)]
        outs = []
        for i, j in itertools.product(range(m), range(m)):
            if (r0 + nr - 1) * m + i >= con.oh or (c0 + nc - 1) * m + j >= con.ow:
                continue  # past the output's edge: not stored
            value = _weighted_sum([(v.at[j][nu], rows[i][nu]) for nu in range(a)
                                   if v.at[j][nu]])
            o = at(steps, start, i, j, r0, c0, nr, nc)
            r = at(r_steps, r_start, i, j, r0, c0, nr, nc)
            outs.append((Access("out", o), _epilogue(c, value, kinds, r, ob, lanes)))
        stages.append(_tile_loops((("ko", k // ob), ("ty", nr)), ("tx", nc),
                                  MapGroup(tuple(outs), "kv", ob // lanes)))
    return tuple(stages)


def _epilogue(c: Compute, value, kinds, o: Affine, ob: int, lanes: int):
    """The fused epilogue as a vector expression: channel operands at the output-channel
    vector, output-shaped ones (residuals) at `o`, the output element in their buffer."""
    chan = Affine((("ko", ob), ("kv", lanes)))
    n = 0
    for op in c.epilogue:
        loads = []
        for _ in op.operands:
            loads.append(Ld(Access(f"e{n}", chan if kinds[n].kind == "channel" else o)))
            n += 1
        value = epilogue_expr(op, value, loads)
    return value


def transformed_weights(w: torch.Tensor, v: Variant = F2) -> torch.Tensor:
    """U = G g G^T for every (k, c): [a^2][C][K] (xi = a * row + column), computed in
    float64."""
    import torch
    g = torch.tensor(v.g, dtype=torch.float64)
    u = torch.einsum("ai,kcij,bj->abck", g, w.double(), g)  # [a][a][C][K]
    return u.reshape(v.xi, w.shape[1], w.shape[0]).float()


def pack_winograd(c: Compute, cfg, operands) -> dict[str, np.ndarray]:
    con, v = Conv2dContraction.from_compute(c), variant(cfg)
    bufs = pack_operands(c, cfg, operands)
    ob = cfg["ob"]
    u = transformed_weights(operands[1].detach(), v)  # [a^2][C][K] -> [a^2][K/OB][C][OB]
    u = u.reshape(v.xi, con.c, con.k // ob, ob).permute(0, 2, 1, 3)
    bufs["b"] = np.ascontiguousarray(u.numpy(), np.float32).ravel()
    tiles = tile_count(con, v)
    bufs["v"] = np.zeros(v.xi * tiles * con.c, np.float32)
    bufs["m"] = np.zeros(v.xi * tiles * con.k, np.float32)
    return bufs
