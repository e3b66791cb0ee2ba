"""Convolutions on AMX tensor tiles in bfloat16 (`llvm -precision=bf16` on a CPU with
amx-bf16), float32 accumulation, activations float32 in memory.

Stage 1 rounds every receptive field to bf16 into a workspace ws[P][R'] (P = OH*OW output
pixels, R = C*KH*KW ordered (c-block, kh, kw, c-in-block) as im2col orders it, R' = R
rounded up to the 32 values of a dot-product step, the rest zero); stage 2 multiplies
blocks of `mt` x 16 pixels by `nt` x 16 output channels on the tile registers (mt*nt
accumulators, mt A and nt B tiles: at most the 8 registers), stores each 16 x 16 float
tile to a scratch block, and the fused epilogue reads it from there into the output
(NHWC, or NCHW[16*nt]c), rows past the last pixel left unwritten. The weights are packed
once, rounded to bf16, in the dot product's pair-interleaved (VNNI) order per 16 channels.

Linux hands a process AMX's tile state only when asked: cpu/build.py's `permit_amx` asks,
once, before the space offers these kernels and before one is loaded.
"""
from __future__ import annotations

import math

import numpy as np

from raytune_kernels.cpu.contraction import Conv2dContraction
from raytune_kernels.cpu.im2col import gemm_outer, tile_variants
from raytune_kernels.cpu.loopnest import (AMX_ROWS, AMX_STEP, PARALLEL, SERIAL, SET, Access,
                                          Affine, AmxGemm, Buffer, For, LoopNest, Split,
                                          StoreTile, Tile, UpdateTile, ZeroTile, to_bf16)
from raytune_kernels.cpu.lower import epilogue_steps, operand_kinds, pack_operands
from raytune_kernels.cpu.machine import CpuInfo
from raytune_kernels.space import Space
from raytune_kernels.task import Compute

LANES = 16  # a tile row of floats is one AVX-512 vector
# (mt, nt): accumulators mt*nt plus mt A and nt B tiles within the 8 tile registers
SHAPES = tuple((m, n) for m in range(1, 4) for n in range(1, 4) if m * n + m + n <= 8)


def applicable(c: Compute, cpu: CpuInfo, precision: str) -> bool:
    return (precision == "bf16" and cpu.amx and LANES in cpu.lanes and c.op == "conv2d"
            and c.attr("groups") == 1 and c.inputs[0].shape[0] == 1
            and c.inputs[0].shape[1] % LANES == 0 and c.output.shape[1] % LANES == 0)


def amx_space(c: Compute, cpu: CpuInfo) -> Space:
    con = Conv2dContraction.from_compute(c)
    cbs = [cb for cb in (16, 32, 64) if con.c % cb == 0] + ([con.c] if con.c > 64 else [])
    combos = [(LANES, LANES * nt, mt, nt, cb) for mt, nt in SHAPES
              if (con.k // LANES) % nt == 0 for cb in cbs]
    independent = (("out_layout", con.out_layouts),
                   ("spatial_order", (("ko", "pt"), ("pt", "ko"))), ("parallel", (1, 2)))
    return Space(("lanes", "ob", "mt", "nt", "cb"), tuple(combos), independent)


def _geometry(con: Conv2dContraction) -> tuple[int, int, int, int]:
    """(R, R' slots per workspace row, pixels P, workspace rows)."""
    r = con.c * con.kh * con.kw
    rp = -(-r // AMX_STEP) * AMX_STEP
    p = con.oh * con.ow
    return r, rp // 2, p, -(-p // AMX_ROWS) * AMX_ROWS


def lower_amx(c: Compute, cfg) -> LoopNest:
    con = Conv2dContraction.from_compute(c)
    cb, mt, nt = cfg["cb"], cfg["mt"], cfg["nt"]
    if cfg["lanes"] != LANES or cb % LANES or con.c % cb or cfg["ob"] != LANES * nt \
            or (con.k // LANES) % nt or (mt, nt) not in SHAPES:
        raise ValueError(f"amx: config {cfg.to_json()} does not fit {c.describe()} (cb a "
                         f"multiple of {LANES} dividing C, ob = {LANES}*nt dividing K, "
                         f"(mt, nt) in {SHAPES})")
    r, row, p, rows = _geometry(con)
    kinds = operand_kinds(c)
    sizes = con.buffer_sizes(cfg)
    bufs = [Buffer("a", sizes["a"], "in"), Buffer("b", con.k * row, "in")]
    bufs += [Buffer(f"e{i}", con.k if k.kind == "channel" else sizes["out"], "in")
             for i, k in enumerate(kinds)]
    bufs += [Buffer("out", sizes["out"], "out"), Buffer("ws", rows * row, "scratch"),
             Buffer("cs", rows * con.k, "scratch")]
    tiles: list[Tile] = []
    body = _copy_stage(con, cfg, row, tiles) + _pad_stage(r, row, p, tiles) \
        + _gemm_stage(c, con, cfg, kinds, row, p, tiles)
    return LoopNest(f"k_{c.key()}_amx", tuple(bufs), tuple(tiles), tuple(body), LANES)


def _copy_stage(con: Conv2dContraction, cfg, row: int, tiles: list) -> list:
    """Receptive fields, rounded to bf16, into ws (slots of two values: halved indices)."""
    cb = cfg["cb"]
    hp, wp = con.padded()
    (sh, sw), (dh, dw) = con.stride, con.dil
    width = min(7, con.ow)
    out = []
    for count, w, offset in tile_variants(con.ow, width):
        tile = Tile(f"c{len(tiles)}", (1, w), cb // LANES)
        tiles.append(tile)
        a = Affine((("cq", hp * wp * cb), ("oh", sh * wp * cb), ("kh", dh * wp * cb),
                    ("kw", dw * cb), ("wt", w * sw * cb)), offset * sw * cb)
        o = Affine((("oh", con.ow * row), ("cq", con.kh * con.kw * cb // 2),
                    ("kh", con.kw * cb // 2), ("kw", cb // 2), ("wt", w * row)), offset * row)
        stmts = (UpdateTile(tile.name, Access("a", a), (0, sw * cb), None, SET),
                 StoreTile(tile.name, Access("ws", o), (0, row), bf16=True))
        inner = (For("kh", con.kh, SERIAL, (For("kw", con.kw, SERIAL,
                                                (For("wt", count, SERIAL, stmts),)),)),)
        extents = (con.c // cb, con.oh)
        out.append(For("q", math.prod(extents), PARALLEL,
                       (Split("q", ("cq", "oh"), extents),) + inner))
    return out


def _pad_stage(r: int, row: int, p: int, tiles: list) -> list:
    """Zeros in each row's values past R (R is a multiple of 16: one vector, or none)."""
    if 2 * row == r:
        return []
    tile = Tile(f"z{len(tiles)}", (1, 1), (2 * row - r) // LANES)
    tiles.append(tile)
    store = StoreTile(tile.name, Access("ws", Affine((("zp", row),), r // 2)), (0, 0),
                      bf16=True)
    return [For("zp", p, SERIAL, (ZeroTile(tile.name), store))]


def _gemm_stage(c: Compute, con: Conv2dContraction, cfg, kinds, row: int, p: int,
                tiles: list) -> list:
    mt, nt, ob = cfg["mt"], cfg["nt"], cfg["ob"]
    nhwc = cfg["out_layout"] == "nhwc"
    steps, kblocks = 2 * row // AMX_STEP, con.k // ob
    # output index of pixel q and channel n: NHWC q*K + n; blocked (n/ob)*P*ob + q*ob + n%ob
    o_ko, o_px = (ob, con.k) if nhwc else (p * ob, ob)
    whole = p // AMX_ROWS  # tiles of 16 pixels, all of them in the image
    out = []
    for count, m, offset, tail in _blocks(whole, p, mt):
        first = offset * AMX_ROWS  # the block's first pixel
        live = {"ko": kblocks, "pt": count}
        # scratch of the block's m x nt tiles: blocks in (pt, ko) order after `first`
        cs = Affine((("pt", m * AMX_ROWS * con.k), ("ko", m * AMX_ROWS * ob)),
                    first * con.k)
        gemm = AmxGemm(Access("ws", Affine((("pt", mt * AMX_ROWS * row),), first * row)),
                       row, Access("b", Affine((("ko", nt * steps * 256),))), steps * 256,
                       steps, m, nt, Access("cs", cs))
        stmts = [gemm]
        for i in range(m):
            rows = min(AMX_ROWS, p - first - i * AMX_ROWS) if tail else AMX_ROWS
            for j in range(nt):
                tile = Tile(f"g{len(tiles)}", (rows, 1), 1)
                tiles.append(tile)
                px = first + i * AMX_ROWS
                o = Affine((("ko", o_ko), ("pt", mt * AMX_ROWS * o_px)), px * o_px + j * LANES)
                epi = epilogue_steps(c, kinds, o, (o_px, 0), live, cfg, first_channel=j * LANES)
                at = cs.offset((i * nt + j) * 256)
                stmts += [UpdateTile(tile.name, Access("cs", at), (LANES, 0), None, SET),
                          StoreTile(tile.name, Access("out", o), (o_px, 0), epi)]
        out.append(gemm_outer(cfg, live, tuple(stmts)))
    return out


def _blocks(whole: int, p: int, mt: int) -> list[tuple[int, int, int, bool]]:
    """(count, tiles, first tile, tail) of the blocks of `mt` whole tiles of 16 pixels,
    then of one block (the tail) with the whole tiles left and the last, partial one."""
    out = [(whole // mt, mt, 0, False)] if whole >= mt else []
    left = whole % mt + (1 if p % AMX_ROWS else 0)
    if left:
        out.append((1, left, (whole // mt) * mt, True))
    return out


def pack_amx(c: Compute, cfg, operands) -> dict[str, np.ndarray]:
    con = Conv2dContraction.from_compute(c)
    bufs = pack_operands(c, cfg, operands)
    r, row, p, rows = _geometry(con)
    bufs["b"] = pack_weights(operands[1], con, cfg["cb"], row)
    bufs["ws"] = np.zeros(rows * row, np.float32)
    bufs["cs"] = np.zeros(rows * con.k, np.float32)
    return bufs


def pack_weights(w, con: Conv2dContraction, cb: int, row: int) -> np.ndarray:
    """[K/16][R'/32][16 pairs][16 channels][2] bf16 of the weights, the reduction in
    ws's order, as float32 slots of two values."""
    k, r = con.k, con.c * con.kh * con.kw
    wr = w.detach().reshape(k, con.c // cb, cb, con.kh, con.kw).permute(0, 1, 3, 4, 2)
    flat = np.zeros((k, 2 * row), np.float32)
    flat[:, :r] = wr.reshape(k, r).numpy()
    vnni = flat.reshape(k // LANES, LANES, 2 * row // AMX_STEP, AMX_STEP // 2, 2)
    vnni = vnni.transpose(0, 2, 3, 1, 4)  # tile, step, pair, channel, value of the pair
    return np.ascontiguousarray(to_bf16(np.ascontiguousarray(vnni))).view(np.float32).ravel()

