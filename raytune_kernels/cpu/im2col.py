"""im2col + GEMM: the alternative algorithm for convolutions, chosen by measurement.

Stage 1 copies every receptive field into a workspace matrix col[P][R] (P = OH*OW output
pixels, R = C*KH*KW ordered (c-block, kh, kw, c-in-block), vector copies of the channel
block); stage 2 is a register-tiled GEMM of col against the weights, which then have the
direct conv's packed layout [K/OB][C/CB][KH][KW][CB][OB] = [K/OB][R][OB], and writes the
same output layouts (blocked or NHWC) with the same fused epilogue. It trades a
memory-bound copy for a plain GEMM inner loop; the tuner measures which wins per layer.
"""
from __future__ import annotations

import math

import numpy as np

from raytune_kernels.cpu.machine import CpuInfo
from raytune_kernels.task import Compute
from raytune_kernels.cpu.contraction import Conv2dContraction
from raytune_kernels.cpu.loopnest import (BCAST_FMA, PARALLEL, SERIAL, SET, UNROLL, Access, Affine,
                                          Buffer, For, LoopNest, Split, StoreTile, Tile,
                                          UpdateTile, ZeroTile)
from raytune_kernels.cpu.lower import epilogue_steps, operand_kinds, pack_operands
from raytune_kernels.space import Space


def applicable(c: Compute) -> bool:
    return (c.op == "conv2d" and c.attr("groups") == 1 and c.inputs[0].shape[0] == 1
            and c.inputs[0].shape[1] % 8 == 0)


def gemm_combos(con: Conv2dContraction, rows: int, cpu: CpuInfo, whole_c: bool = False
                ) -> list[tuple[int, int, int, int]]:
    """(lanes, ob, tile_h, cb) of a conv computed as a GEMM over `rows` rows (im2col's
    pixels, Winograd's tiles): `tile_h` rows by ob/lanes vectors of accumulators within
    the register file, enough of them to hide the FMA latency; cb is the input's channel
    block, whole vectors (the copy or transform moves vectors of it), or all of C
    (NHWC) with `whole_c`."""
    combos, regs = [], cpu.regs
    for lanes in cpu.lanes:
        cbs = [cb for cb in (8, 16, 32, 64) if con.c % cb == 0 and cb % lanes == 0]
        cbs += [con.c] if whole_c and con.c > 64 and con.c % lanes == 0 else []
        for vecs in (1, 2, 3, 4):
            ob = vecs * lanes
            if con.k % ob:
                continue
            for th in range(1, 29):
                acc = th * vecs
                if acc + vecs + 1 <= regs and acc >= min(cpu.chains(lanes), rows * vecs) and \
                        th <= rows:
                    combos += [(lanes, ob, th, cb) for cb in cbs]
    return combos


def im2col_space(c: Compute, cpu: CpuInfo) -> Space:
    con = Conv2dContraction.from_compute(c)
    combos = gemm_combos(con, con.oh * con.ow, cpu)
    independent = (("copy_w", (1, 2, 4, 7, 8)), ("out_layout", con.out_layouts),
                   ("spatial_order", (("ko", "pt"), ("pt", "ko"))), ("parallel", (1, 2)))
    return Space(("lanes", "ob", "tile_h", "cb"), tuple(combos), independent)


def lower_im2col(c: Compute, cfg) -> LoopNest:
    con = Conv2dContraction.from_compute(c)
    lanes, cb = cfg["lanes"], cfg["cb"]
    if cb % lanes or con.c % cb:
        raise ValueError(f"im2col: cb={cb} must divide C={con.c} and be a multiple of "
                         f"lanes={lanes}")
    r, p = con.c * con.kh * con.kw, con.oh * con.ow
    kinds = operand_kinds(c)
    sizes = con.buffer_sizes(cfg)
    bufs = [Buffer("a", sizes["a"], "in"), Buffer("b", sizes["b"], "in")]
    bufs += [Buffer(f"e{i}", con.k if k.kind == "channel" else sizes["out"], "in")
             for i, k in enumerate(kinds)]
    bufs += [Buffer("out", sizes["out"], "out"), Buffer("ws", p * r, "scratch")]
    tiles, body = [], []
    copy = _copy_stage(con, cfg, r, tiles)
    gemm = _gemm_stage(c, con, cfg, kinds, r, p, tiles)
    body = copy + gemm
    return LoopNest(f"k_{c.key()}_im2col", tuple(bufs), tuple(tiles), tuple(body), lanes)


def _copy_stage(con: Conv2dContraction, cfg, r: int, tiles: list) -> list:
    cb, lanes = cfg["cb"], cfg["lanes"]
    hp, wp = con.padded()
    (sh, sw), (dh, dw) = con.stride, con.dil
    tw = min(cfg["copy_w"], con.ow)
    out = []
    for count, width, offset in tile_variants(con.ow, tw):
        tile = Tile(f"c{len(tiles)}", (1, width), cb // lanes)
        tiles.append(tile)
        a = Affine((("cq", hp * wp * cb), ("oh", sh * wp * cb), ("kh", dh * wp * cb),
                    ("kw", dw * cb), ("wt", width * sw * cb)), offset * sw * cb)
        o = Affine((("oh", con.ow * r), ("cq", con.kh * con.kw * cb), ("kh", con.kw * cb),
                    ("kw", cb), ("wt", width * r)), offset * r)
        stmts = (UpdateTile(tile.name, Access("a", a), (0, sw * cb), None, SET),
                 StoreTile(tile.name, Access("ws", o), (0, r)))
        out.append(copy_loops(con, cb, count, stmts))
    return out


def copy_loops(con: Conv2dContraction, cb: int, count: int, stmts: tuple) -> For:
    """The loops of a receptive-field copy around `stmts`: (channel block cq, output row
    oh) shared out, then kh, kw and `count` column tiles wt."""
    inner = (For("kh", con.kh, SERIAL, (For("kw", con.kw, SERIAL,
                                            (For("wt", count, SERIAL, stmts),)),)),)
    extents = (con.c // cb, con.oh)
    return For("q", math.prod(extents), PARALLEL, (Split("q", ("cq", "oh"), extents),) + inner)


def _gemm_stage(c: Compute, con, cfg, kinds, r: int, p: int, tiles: list) -> list:
    ob, th = cfg["ob"], cfg["tile_h"]
    nhwc = cfg["out_layout"] == "nhwc"
    o_ko, o_p = (ob, con.k) if nhwc else (p * ob, ob)
    unroll = max(d for d in range(1, 17) if r % d == 0)
    out = []
    for count, rows, offset in tile_variants(p, th):
        tile = Tile(f"g{len(tiles)}", (rows, 1), ob // cfg["lanes"])
        tiles.append(tile)
        live = {"ko": con.k // ob, "pt": count}
        a = Affine((("pt", rows * r), ("rq", unroll), ("ri", 1)), offset * r)
        b = Affine((("ko", r * ob), ("rq", unroll * ob), ("ri", ob)))
        o = Affine((("ko", o_ko), ("pt", rows * o_p)), offset * o_p)
        epi = epilogue_steps(c, kinds, o, (o_p, 0), live, cfg)
        update = UpdateTile(tile.name, Access("ws", a), (r, 0), Access("b", b), BCAST_FMA)
        stmts = (ZeroTile(tile.name),
                 For("rq", r // unroll, SERIAL, (For("ri", unroll, UNROLL, (update,)),)),
                 StoreTile(tile.name, Access("out", o), (o_p, 0), epi))
        out.append(gemm_outer(cfg, live, stmts))
    return out


def gemm_outer(cfg, live: dict, stmts: tuple):
    """The GEMM's spatial loops around `stmts`: the first `parallel` of them fused into one
    parallel loop, the rest serial, in the config's order."""
    order = list(cfg["spatial_order"])
    fused, rest = order[: cfg["parallel"]], order[cfg["parallel"]:]
    for v in reversed(rest):
        stmts = (For(v, live[v], SERIAL, stmts),)
    extents = tuple(live[v] for v in fused)
    return For("g", math.prod(extents), PARALLEL, (Split("g", tuple(fused), extents),) + stmts)


def tile_variants(extent: int, tile: int) -> list[tuple[int, int, int]]:
    """(count, size, offset) of the full tiles of `extent` and of its ragged tail."""
    out = [(extent // tile, tile, 0)] if extent >= tile else []
    if extent % tile:
        out.append((1, extent % tile, (extent // tile) * tile))
    return out


def pack_im2col(c: Compute, cfg, operands) -> dict[str, np.ndarray]:
    con = Conv2dContraction.from_compute(c)
    bufs = pack_operands(c, cfg, operands)
    bufs["ws"] = np.zeros(con.oh * con.ow * con.c * con.kh * con.kw, np.float32)
    return bufs
