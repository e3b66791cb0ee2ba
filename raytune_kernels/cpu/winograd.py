"""Winograd F(2x2, 3x3): the third algorithm for 3x3 stride-1 convolutions, chosen by
measurement like im2col.

Each 2x2 block of outputs (a tile t) needs a 4x4 window d of the (bordered) input, and
Y = A^T [ sum_c (G g G^T) (.) (B^T d B) ] A: 16 products per tile and channel pair instead
of 36, so the multiply work drops 2.25x, paid for with two cheap linear transforms.

- Stage 1 (input transform, parallel over channel blocks x tile rows): V[xi][t][c] =
  (B^T d B)[xi] for every tile and channel, vectors along the channel block (the input is
  the direct conv's bordered [C/CB][Hp][Wp][CB], so its layouts and labels are the same).
- Stage 2 (16 GEMMs, register-tiled like im2col's):
  M[xi][t][k] = sum_c V[xi][t][c] U[xi][c][k], with U = G g G^T packed once as
  [16][K/OB][C][OB] (a constant, like every packed weight).
- Stage 3 (output transform and the fused epilogue, parallel over output-channel blocks x
  tile rows): Y = A^T M A for each tile, written in the direct conv's output layouts.
V and M are workspaces (kernel buffers "v", "m", shared by every step of a compiled
network). Needs an even output (every tile whole). F(2x2, 3x3)'s transforms are +-1 and
1/2, so float32 rounding stays small: the tests hold built kernels to the reference within
1e-4 and the interpreted nest within 1e-5, as for the direct conv.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from raytune_kernels.cpu.machine import CpuInfo
from raytune_kernels.task import Compute
from raytune_kernels.cpu.contraction import Conv2dContraction
from raytune_kernels.cpu.im2col import gemm_outer, tile_variants, gemm_combos
from raytune_kernels.cpu.loopnest import (BCAST_FMA, PARALLEL, SERIAL, UNROLL, Access, Affine, Bin,
                                          Buffer, For, Ld, LoopNest, Map, Num, Split, StoreTile,
                                          Tile, UpdateTile, ZeroTile)
from raytune_kernels.cpu.lower import operand_kinds, pack_operands
from raytune_kernels.cpu.rows import epilogue_expr
from raytune_kernels.space import Space

BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))  # B^T
G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))
AT = ((1, 1, 1, 0), (0, 1, -1, -1))  # A^T
XI = 16  # the 4x4 transformed positions


def applicable(c: Compute) -> bool:
    """3x3, stride 1, no dilation, one group, batch 1, channel counts that fill vectors,
    and an even output (whole 2x2 tiles)."""
    if c.op != "conv2d" or c.attr("groups") != 1 or c.inputs[0].shape[0] != 1:
        return False
    _, ch, _, _ = c.inputs[0].shape
    k, _, kh, kw = c.inputs[1].shape
    _, _, oh, ow = c.output.shape
    return ((kh, kw) == (3, 3) and tuple(c.attr("stride")) == (1, 1)
            and tuple(c.attr("dilation")) == (1, 1) and ch % 8 == 0 and k % 8 == 0
            and oh % 2 == 0 and ow % 2 == 0)


def winograd_space(c: Compute, cpu: CpuInfo) -> Space:
    con = Conv2dContraction.from_compute(c)
    combos = gemm_combos(con, (con.oh // 2) * (con.ow // 2), cpu, whole_c=True)
    independent = (("out_layout", con.out_layouts),
                   ("spatial_order", tuple(itertools.permutations(("xi", "ko", "pt")))),
                   ("parallel", (1, 2)))
    return Space(("lanes", "ob", "tile_h", "cb"), tuple(combos), independent)


def _signed_sum(terms: list[tuple[int, object]]):
    """sum(coef * x) for coefs +-1, as adds and subtracts (a positive term first)."""
    terms = sorted(terms, key=lambda t: -t[0])
    value = terms[0][1] if terms[0][0] > 0 else Bin("sub", Num(0.0), terms[0][1])
    for coef, x in terms[1:]:
        value = Bin("add" if coef > 0 else "sub", value, x)
    return value


def lower_winograd(c: Compute, cfg) -> LoopNest:
    con = Conv2dContraction.from_compute(c)
    lanes, cb, ob = cfg["lanes"], cfg["cb"], cfg["ob"]
    if not applicable(c):
        raise ValueError(f"winograd does not apply to {c.describe()}")
    if cb % lanes or con.c % cb or ob % lanes or con.k % ob:
        raise ValueError(f"winograd: cb={cb} and ob={ob} must divide C={con.c} and "
                         f"K={con.k} and be multiples of lanes={lanes}")
    tiles = (con.oh // 2) * (con.ow // 2)
    kinds = operand_kinds(c)
    sizes = con.buffer_sizes(cfg)
    bufs = [Buffer("a", sizes["a"], "in"), Buffer("b", XI * con.c * con.k, "in")]
    bufs += [Buffer(f"e{i}", con.k if k.kind == "channel" else sizes["out"], "in")
             for i, k in enumerate(kinds)]
    bufs += [Buffer("out", sizes["out"], "out"), Buffer("v", XI * tiles * con.c, "scratch"),
             Buffer("m", XI * tiles * con.k, "scratch")]
    tile_list: list[Tile] = []
    body = [_input_stage(con, cfg, tiles)] + _gemm_stage(con, cfg, tiles, tile_list)
    body.append(_output_stage(c, con, cfg, tiles, kinds))
    return LoopNest(f"k_{c.key()}_winograd", tuple(bufs), tuple(tile_list), tuple(body),
                    lanes)


def _input_stage(con: Conv2dContraction, cfg, tiles: int):
    lanes, cb = cfg["lanes"], cfg["cb"]
    hp, wp = con.padded()
    twid = con.ow // 2
    maps = []
    for xi in range(XI):
        ksi, nu = divmod(xi, 4)
        terms = []
        for i, j in itertools.product(range(4), range(4)):
            coef = BT[ksi][i] * BT[nu][j]
            if coef:
                at = Affine((("cq", hp * wp * cb), ("ty", 2 * wp * cb), ("tx", 2 * cb),
                             ("cv", lanes)), i * wp * cb + j * cb)
                terms.append((coef, Ld(Access("a", at))))
        out = Affine((("cq", cb), ("ty", twid * con.c), ("tx", con.c), ("cv", lanes)),
                     xi * tiles * con.c)
        maps.append(Map(Access("v", out), _signed_sum(terms), "cv", cb // lanes))
    extents = (con.c // cb, con.oh // 2)
    inner = For("tx", twid, SERIAL, tuple(maps))
    return For("q", math.prod(extents), PARALLEL, (Split("q", ("cq", "ty"), extents), inner))


def _gemm_stage(con: Conv2dContraction, cfg, tiles: int, tile_list: list) -> list:
    ob, th, c, k = cfg["ob"], cfg["tile_h"], con.c, con.k
    unroll = max(d for d in range(1, 17) if c % d == 0)
    out = []
    for count, rows, offset in tile_variants(tiles, th):
        tile = Tile(f"g{len(tile_list)}", (rows, 1), ob // cfg["lanes"])
        tile_list.append(tile)
        live = {"xi": XI, "ko": k // ob, "pt": count}
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


def _output_stage(c: Compute, con: Conv2dContraction, cfg, tiles: int, kinds):
    lanes, ob, k = cfg["lanes"], cfg["ob"], con.k
    twid = con.ow // 2
    nhwc = cfg["out_layout"] == "nhwc"
    maps = []
    for i, j in itertools.product(range(2), range(2)):
        terms = []
        for xi in range(XI):
            coef = AT[i][xi // 4] * AT[j][xi % 4]
            if coef:
                at = Affine((("ty", twid * k), ("tx", k), ("ko", ob), ("kv", lanes)),
                            xi * tiles * k)
                terms.append((coef, Ld(Access("m", at))))
        if nhwc:
            o = Affine((("ty", 2 * con.ow * k), ("tx", 2 * k), ("ko", ob), ("kv", lanes)),
                       i * con.ow * k + j * k)
        else:
            o = Affine((("ko", con.oh * con.ow * ob), ("ty", 2 * con.ow * ob),
                        ("tx", 2 * ob), ("kv", lanes)), i * con.ow * ob + j * ob)
        value = _epilogue(c, _signed_sum(terms), kinds, o, ob, lanes)
        maps.append(Map(Access("out", o), value, "kv", ob // lanes))
    extents = (k // ob, con.oh // 2)
    inner = For("tx", twid, SERIAL, tuple(maps))
    return For("q", math.prod(extents), PARALLEL, (Split("q", ("ko", "ty"), extents), inner))


def _epilogue(c: Compute, value, kinds, o: Affine, ob: int, lanes: int):
    """The fused epilogue as a vector expression: channel operands at the output-channel
    vector, output-shaped ones (residuals) at the output element, in its layout."""
    chan = Affine((("ko", ob), ("kv", lanes)))
    n = 0
    for op in c.epilogue:
        loads = []
        for _ in op.operands:
            loads.append(Ld(Access(f"e{n}", chan if kinds[n].kind == "channel" else o)))
            n += 1
        value = epilogue_expr(op, value, loads)
    return value


def transformed_weights(w: torch.Tensor) -> torch.Tensor:
    """U = G g G^T for every (k, c): [16][C][K] (xi = 4 * row + column)."""
    g = torch.tensor(G, dtype=torch.float64)
    u = torch.einsum("ai,kcij,bj->abck", g, w.double(), g)  # [4][4][C][K]
    return u.reshape(XI, w.shape[1], w.shape[0]).float()


def pack_winograd(c: Compute, cfg, operands) -> dict[str, np.ndarray]:
    con = Conv2dContraction.from_compute(c)
    bufs = pack_operands(c, cfg, operands)
    ob = cfg["ob"]
    u = transformed_weights(operands[1].detach())  # [16][C][K] -> [16][K/OB][C][OB]
    u = u.reshape(XI, con.c, con.k // ob, ob).permute(0, 2, 1, 3)
    bufs["b"] = np.ascontiguousarray(u.numpy(), np.float32).ravel()
    tiles = (con.oh // 2) * (con.ow // 2)
    bufs["v"] = np.zeros(XI * tiles * con.c, np.float32)
    bufs["m"] = np.zeros(XI * tiles * con.k, np.float32)
    return bufs
