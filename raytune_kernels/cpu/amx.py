"""Convolutions, denses and batched matmuls on AMX tensor tiles in bfloat16 (`llvm
-precision=bf16` on a CPU with amx-bf16), float32 accumulation, activations float32 in
memory: convs of groups 1, batch 1, input channels in whole 16s or few enough to fold
(output channels any: a last block of fewer than 16 is masked); denses whose reduction
is in whole 16s; batched matmuls of any shape (_lower_matmul: both operands rounded at
run time).

A dense y[M, N] = x[M, K] @ w[N, K]^T is the 1x1 conv of K channels over an M x 1 image
into N channels padded to the channel block (its output [M][Npad], as the dense's own
kernels write it): NHWC of that image is the dense's row-major x and y, so the conv's
im2col fields serve it unchanged (tiles of 16 rows).

How the operand reaches the tiles is the knob `fields`. With "direct", the bordered NHWC
input is rounded to bf16 once (each pixel's channels padded with zeros to a step's 32)
and each (kh, kw) read from it at the stride: a tap of AmxGemm, A tiles of up to 16
pixels of one output row. A conv whose channels fill no 16-lane vector (a stem's 3) takes
"folded": each rounded pixel holds the kw x C values that follow its input pixel in NHWC
(one run), one tap per kh. With "im2col", whole receptive fields are rounded into a
workspace ws[P][R'] (P = OH*OW output pixels, R = C*KH*KW ordered (c-block, kh, kw,
c-in-block), R' = R rounded up to a step's 32, the rest zero), A tiles of up to 16 pixels
in whole output rows or a near-equal part of one row (pixel_tile): where pixel blocks are
shared out and every channel block runs in turn for each (spatial_order (pt, ko),
parallel 1), a block's fields are rounded just before its products, while in cache
(fused_pack); otherwise the whole image first.

Either way a tile's pixels are consecutive rows of what it reads and its outputs an
affine tile of the output: blocks of `mt` tiles down the rows are multiplied by `nt` x 16
output channels on the tile registers (mt*nt accumulators, mt A and nt B tiles: at most
the 8 registers), each float tile stored to a scratch block, and the fused epilogue reads
it from there into the output (NHWC in the space, NCHW[16*nt]c by hand; in a bordered
buffer where the plan gives one; a residual read from its own, as the direct conv does).
The weights are packed once, rounded to bf16, in the dot product's pair-interleaved
(VNNI) order per 16 channels.

Linux hands a process AMX's tile state only when asked: cpu/build.py's `permit_amx` asks,
once, before the space offers these kernels and before one is loaded.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from raytune_kernels.cpu.contraction import Conv2dContraction, MatmulContraction
from raytune_kernels.cpu.contraction_base import residual_cfg
from raytune_kernels.cpu.im2col import copy_loops, gemm_outer, tile_variants
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
# how A reaches the tiles: "im2col", whole receptive fields rounded into a workspace (tiles
# of whole rows: full tiles over small maps), or "direct", the input rounded once and each
# (kh, kw) read from it at the stride (9x less to round for a 3x3 conv, tiles in one row)
FIELDS = ("im2col", "direct")
# a conv whose channels fill no vector (a stem's 3): "folded", the input rounded once with
# each pixel's run of kw x C values (contiguous in NHWC) as its channels, one tap per kh
FOLD_MOST = 64  # the longest run of kw x C values folded (a stem's 7 x 3 = 21)
CHUNKS = (4, 6, 8, 12, 16)  # steps of 32 values: a chunk of 16 x 16 rows of A is 8-32 KiB


def precision_problem(cpu: CpuInfo, precision: str) -> str | None:
    """Why a CPU cannot compute in `precision` (an llvm target's), or None."""
    if precision != "fp32" and not cpu.amx:
        return (f"precision {precision} runs convolutions, denses and matmuls on AMX "
                f"tiles (amx-tile, amx-bf16), which {cpu.name} lacks")
    return None


def applicable(c: Compute, cpu: CpuInfo, precision: str) -> bool:
    if not (precision == "bf16" and cpu.amx and LANES in cpu.lanes):
        return False
    if c.op == "dense":
        return c.inputs[0].shape[-1] % LANES == 0
    if c.op == "matmul":
        return MatmulContraction.from_compute(c) is not None
    if not (c.op == "conv2d" and c.attr("groups") == 1 and c.inputs[0].shape[0] == 1):
        return False
    return bool(fields_of(view(c)))


def view(c: Compute, ob: int = LANES) -> Conv2dContraction:
    """The conv these tiles compute: a conv's own, or a dense's 1x1 conv of K channels
    over an M x 1 image into N channels padded to a multiple of the channel block `ob`."""
    if c.op != "dense":
        return Conv2dContraction.from_compute(c)
    *lead, k = c.inputs[0].shape
    m, n = math.prod(lead), c.inputs[1].shape[0]
    return Conv2dContraction(1, k, m, 1, -(-n // ob) * ob, 1, 1, m, 1, (1, 1), (0, 0),
                             (1, 1))


def fields_of(con: Conv2dContraction) -> tuple[str, ...]:
    """The ways A can reach the tiles for this conv (knob `fields`): a single column (a
    dense's rows) reads its fields as whole-row tiles alone."""
    if con.c % LANES == 0 and con.ow == 1 == con.kh * con.kw:
        return ("im2col",)
    if con.c % LANES == 0:
        return FIELDS
    if con.kw * con.c <= FOLD_MOST and con.dil[1] == 1:
        return ("folded",)
    return ()


def matmul_space(c: Compute) -> Space:
    """A batched matmul's: both operands rounded at run time, B into the dot product's
    pair order; its output row-major, as the matmul's own kernels write it."""
    con = MatmulContraction.from_compute(c)
    blocks = -(-con.n // LANES)  # the last masked where 16 does not divide N: alone (nt 1)
    combos = [(LANES, LANES * nt, mt, nt) for mt, nt in SHAPES
              if blocks % nt == 0 and (con.n % LANES == 0 or nt == 1)]
    independent = (("spatial_order", (("bt", "pt", "ko"), ("bt", "ko", "pt"))),
                   ("parallel", (1, 2)))
    return Space(("lanes", "ob", "mt", "nt"), tuple(combos), independent)


def amx_space(c: Compute, cpu: CpuInfo) -> Space:
    """NHWC in (cb = C) and out: the layout decides no speed here (the rounding copies
    a pixel's channels at (kh, kw) as one run, every channel block of the products reads
    the same workspace), and one layout for every AMX conv leaves the plan no transform
    to place between them, where records of mixed layouts left 15 in ResNet-18. A dense's
    view is NHWC of its own row-major buffers."""
    con = view(c)
    combos = [(LANES, LANES * nt, mt, nt, con.c, fields, chunk) for mt, nt in SHAPES
              if c.op == "dense" or _fits(con, nt)  # a dense's N is padded
              for fields in fields_of(con) for chunk in chunks(con, fields)]
    independent = (("out_layout", ("nhwc",)),
                   ("spatial_order", (("ko", "pt"), ("pt", "ko"))), ("parallel", (1, 2)))
    return Space(("lanes", "ob", "mt", "nt", "cb", "fields", "chunk"), tuple(combos),
                 independent)


def _fits(con: Conv2dContraction, nt: int) -> bool:
    """Whether nt blocks of 16 output channels at a time tile K: they divide its blocks,
    and a masked last block (16 not dividing K) goes alone."""
    return -(-con.k // LANES) % nt == 0 and (con.k % LANES == 0 or nt == 1)


def chunks(con: Conv2dContraction, fields: str) -> tuple[int, ...]:
    """Steps of the reduction a block's products walk before the next block's (knob
    `chunk`; 0: the whole of it): with im2col fields, the operand that stays while the
    inner loop turns (A's rows or B's channels) is then a chunk, which stays in L1 where
    the whole reduction would not."""
    if fields != "im2col":
        return (0,)
    steps = 2 * _geometry(con)[1] // AMX_STEP
    return (0,) + tuple(k for k in CHUNKS if k < steps and steps % k == 0)


def _geometry(con: Conv2dContraction) -> tuple[int, int, int]:
    """(R, slots per workspace row (R' / 2), pixels P)."""
    r = con.c * con.kh * con.kw
    return r, -(-r // AMX_STEP) * AMX_STEP // 2, con.oh * con.ow


def _rounded(con: Conv2dContraction, fields: str
             ) -> tuple[int, int, int, tuple[int, ...], int]:
    """Of the input rounded once (direct or folded fields): (values of a pixel's run, C
    or kw x C; slots per rounded pixel, the run padded to a step's 32; rounded pixels per
    row; the taps, slot offsets of each (kh, kw), or of each kh where kw is folded; input
    columns a rounded pixel steps over). Folded, only the columns an output column starts
    at are rounded, one in `stride`: a stem of stride 2 reads every other fold."""
    hp, wp = con.padded()
    (dh, dw) = con.dil
    if fields == "folded":
        step = con.stride[1]
        run, columns = con.kw * con.c, con.ow
        taps = tuple(kh * dh * columns for kh in range(con.kh))
    else:
        step, run, columns = 1, con.c, wp
        taps = tuple(kh * dh * wp + kw * dw for kh in range(con.kh) for kw in range(con.kw))
    pixel = -(-run // AMX_STEP) * AMX_STEP // 2
    return run, pixel, columns, tuple(t * pixel for t in taps), step


def pixel_tile(con: Conv2dContraction, fields: str = "im2col") -> tuple[int, int]:
    """(rows, columns) of the output pixels one A tile holds, at most 16, in whole rows
    where a row has 16 pixels or fewer, else in near-equal parts of one row: the pixels
    of a tile are then consecutive rows of the workspace, and its outputs an affine tile
    of the output (which may have a border)."""
    if con.ow <= AMX_ROWS:  # read from the rounded input, a tile is in one output row
        return (max(1, min(AMX_ROWS // con.ow, con.oh)) if fields == "im2col" else 1), \
            con.ow
    parts = -(-con.ow // AMX_ROWS)
    return 1, -(-con.ow // parts)


def fused_pack(cfg) -> bool:
    """Whether a config rounds each block's receptive fields just before its products
    (pixel blocks shared out, every channel block in turn: the block's A stays in cache)
    rather than the whole image first."""
    return cfg.get("fields", "im2col") == "im2col" and \
        tuple(cfg["spatial_order"]) == ("pt", "ko") and cfg["parallel"] == 1


def lower_amx(c: Compute, cfg) -> LoopNest:
    if c.op == "matmul":
        return _lower_matmul(c, cfg)
    con = view(c, cfg["ob"])
    cb, mt, nt = cfg["cb"], cfg["mt"], cfg["nt"]
    whole = cb == con.c or cb % LANES == 0  # the folded fields' NHWC: any C
    if cfg["lanes"] != LANES or not whole or con.c % cb or cfg["ob"] != LANES * nt \
            or not _fits(con, nt) or (mt, nt) not in SHAPES:
        raise ValueError(f"amx: config {cfg.to_json()} does not fit {c.describe()} (cb C "
                         f"or a multiple of {LANES} dividing it, ob = {LANES}*nt, nt "
                         f"dividing K's blocks of {LANES}, 1 where a block is partial; "
                         f"(mt, nt) in {SHAPES})")
    fields = cfg.get("fields", "im2col")
    if fields not in fields_of(con):
        raise ValueError(f"amx: fields={fields!r} for {c.describe()}, expected one of "
                         f"{fields_of(con)}")
    if cfg.get("chunk", 0) not in chunks(con, fields):
        raise ValueError(f"amx: chunk={cfg['chunk']} for {c.describe()} with {fields} "
                         f"fields, expected one of {chunks(con, fields)}")
    r, row, p = _geometry(con)
    direct = fields != "im2col"
    hp, wp = con.padded()
    _, pixel, columns, taps, _ = _rounded(con, fields) if direct else (0, 0, 0, (), 1)
    kinds = operand_kinds(c)
    sizes = con.buffer_sizes(cfg)
    tiles: list[Tile] = []
    gemm, scratch = _gemm_stage(c, con, cfg, kinds, row, tiles)
    reduction = len(taps) * pixel if direct else row  # B's slots per output channel
    bufs = [Buffer("a", sizes["a"], "in"),
            Buffer("b", -(-con.k // LANES) * LANES * reduction, "in")]
    bufs += [Buffer(f"e{i}", con.k if k.kind == "channel" else
                    con.buffer_sizes(residual_cfg(cfg))["out"], "in")
             for i, k in enumerate(kinds)]
    bufs += [Buffer("out", sizes["out"], "out"),
             Buffer("ws", hp * columns * pixel if direct else p * row, "scratch"),
             Buffer("cs", scratch, "scratch")]
    if direct:
        ahead = _round_input(con, cfg, tiles)
    elif fused_pack(cfg):
        ahead = []
    else:
        ahead = _copy_stage(con, cfg, row, tiles) + _pad_stage(r, row, p, tiles)
    return LoopNest(f"k_{c.key()}_amx", tuple(bufs), tuple(tiles), tuple(ahead + gemm),
                    LANES)


def _copy_stage(con: Conv2dContraction, cfg, row: int, tiles: list) -> list:
    """Receptive fields, rounded to bf16, into ws (slots of two values: halved indices)."""
    cb = cfg["cb"]
    out = []
    for count, w, offset in tile_variants(con.ow, min(7, con.ow)):
        stmts = _copy(con, cb, row, tiles, w, Affine((("wt", w),), offset),
                      Affine((("oh", 1),)))
        out.append(copy_loops(con, cb, count, stmts))
    return out


def _copy(con: Conv2dContraction, cb: int, row: int, tiles: list, width: int,
          col: Affine, oh: Affine) -> tuple:
    """One copy of `width` pixels' channel block cq at (kh, kw) into their workspace rows:
    the output pixels of row `oh` from column `col` (affine in loop variables)."""
    hp, wp = con.padded()
    (sh, sw), (dh, dw) = con.stride, con.dil
    tile = Tile(f"c{len(tiles)}", (1, width), cb // LANES)
    tiles.append(tile)
    a = _combine((oh, sh * wp * cb), (col, sw * cb),
                 Affine((("cq", hp * wp * cb), ("kh", dh * wp * cb), ("kw", dw * cb))))
    o = _combine((oh, con.ow * row), (col, row),
                 Affine((("cq", con.kh * con.kw * cb // 2), ("kh", con.kw * cb // 2),
                         ("kw", cb // 2))))
    return (UpdateTile(tile.name, Access("a", a), (0, sw * cb), None, SET),
            StoreTile(tile.name, Access("ws", o), (0, row), bf16=True))


def _round_input(con: Conv2dContraction, cfg, tiles: list) -> list:
    """The bordered NHWC input rounded to bf16 once (direct and folded fields): each
    rounded pixel the run of values at its input pixel (C, or kw x C folded), in whole
    vectors (the last one's lanes past the run read as zeros), then zeros to a step's 32."""
    hp, wp = con.padded()
    run, pixel, columns, _, step = _rounded(con, cfg["fields"])
    if cfg["cb"] != con.c:
        raise ValueError(f"amx: {cfg['fields']} fields read NHWC (cb = {con.c}), got "
                         f"cb={cfg['cb']}")
    vecs = -(-run // LANES)
    tile = Tile(f"c{len(tiles)}", (1, 1), vecs, run % LANES)
    tiles.append(tile)
    at = Affine((("y", wp * con.c), ("x", step * con.c)))
    to = Affine((("y", columns * pixel), ("x", pixel)))
    stmts = (UpdateTile(tile.name, Access("a", at), (0, 0), None, SET),
             StoreTile(tile.name, Access("ws", to), (0, 0), bf16=True))
    if 2 * pixel > vecs * LANES:
        zero = Tile(f"z{len(tiles)}", (1, 1), (2 * pixel - vecs * LANES) // LANES)
        tiles.append(zero)
        stmts += (ZeroTile(zero.name), StoreTile(zero.name, Access("ws", to.offset(
            vecs * LANES // 2)), (0, 0), bf16=True))
    return [For("y", hp, PARALLEL, (For("x", columns, SERIAL, stmts),))]


def _combine(*parts) -> Affine:
    """The sum of (affine, scale) pairs, and of plain affines."""
    terms, const = [], 0
    for part in parts:
        x, k = part if isinstance(part, tuple) else (part, 1)
        terms += [(v, c * k) for v, c in x.terms]
        const += x.const * k
    return Affine(tuple(terms), const)


def _pad_stage(r: int, row: int, p: int, tiles: list) -> list:
    """Zeros in each row's values past R (R is a multiple of 16: one vector, or none)."""
    if 2 * row == r:
        return []
    tile = Tile(f"z{len(tiles)}", (1, 1), (2 * row - r) // LANES)
    tiles.append(tile)
    store = StoreTile(tile.name, Access("ws", Affine((("zp", row),), r // 2)), (0, 0),
                      bf16=True)
    return [For("zp", p, SERIAL, (ZeroTile(tile.name), store))]
def _gemm_stage(c: Compute, con: Conv2dContraction, cfg, kinds, row: int, tiles: list
                ) -> tuple[list, int]:
    """The products and the fused epilogue, per run of pixel blocks of one shape (blocks of
    `mt` tiles down the rows, tiles of pixel_tile() along them, each with its ragged tail),
    over the whole blocks of 16 output channels and then a masked last one: (the loops,
    the scratch floats they use)."""
    mt, nt, ob = cfg["mt"], cfg["nt"], cfg["ob"]
    fields = cfg.get("fields", "im2col")
    steps = 2 * row // AMX_STEP
    nb, tail = -(-con.k // LANES), con.k % LANES
    th, tw = pixel_tile(con, fields)
    taps = (0,)
    if fields != "im2col":  # tiles in one output row, read at the stride from the input
        (sh, sw) = con.stride
        _, pixel, columns, taps, step = _rounded(con, fields)
        sw //= step  # rounded pixels between two output columns' first
        steps = 2 * pixel // AMX_STEP
    o_ko, o_row, o_col = con.out_steps(cfg)  # the output's, bordered where the plan says
    rcfg = residual_cfg(cfg)
    r_ko, r_row, r_col = con.out_steps(rcfg)
    b_tile = len(taps) * steps * 256  # B's slots per block of 16 channels
    chunk = cfg.get("chunk", 0) or steps
    # a block's C tiles go to scratch and its epilogue reads them back at once: blocks run
    # one after another by one thread (the serial loop inside the parallel one, where the
    # epilogue follows each block's products) share their slot, which stays in L1, rather
    # than each taking its own, a workspace as large as the output
    shared = cfg["parallel"] == 1 and steps // chunk == 1
    serial = cfg["spatial_order"][1] if shared else None
    out, scratch = [], 0
    # the channel blocks in whole vectors, nt at a time, then a masked last one alone
    for first, kb, mask in ((0, (nb - bool(tail)) // nt, 0), (nb - 1, int(bool(tail)), tail)):
        if not kb:
            continue
        at, r_at = first * LANES * o_ko // ob, first * LANES * r_ko // ob
        for nr, rows, row0 in tile_variants(con.oh, mt * th):
            heights = [th] * (rows // th) + ([rows % th] if rows % th else [])
            for nc, w, col0 in tile_variants(con.ow, tw):
                cap = len(heights) * nt * 256  # a block's C tiles, 16 rows each at most
                slots = {"pt": nr * nc, "ko": kb}
                if serial:
                    slots[serial] = 1
                cs = Affine(tuple(t for t in (("pr", nc * slots["ko"] * cap),
                                              ("pc", slots["ko"] * cap), ("ko", cap))
                                  if slots["pt" if t[0] != "ko" else "ko"] > 1), scratch)
                scratch += slots["pt"] * slots["ko"] * cap
                if fields != "im2col":  # output (row, col) reads input (row*sh, col*sw) on
                    a = Affine((("pr", mt * sh * columns * pixel), ("pc", tw * sw * pixel)),
                               (row0 * sh * columns + col0 * sw) * pixel)
                    a_row, a_tile = sw * pixel, sh * columns * pixel
                else:
                    a = Affine((("pr", mt * th * con.ow * row), ("pc", tw * row)),
                               (row0 * con.ow + col0) * row)
                    a_row, a_tile = row, th * con.ow * row
                b = Affine((("ko", nt * b_tile),), first * b_tile)
                gemms = [AmxGemm(Access("ws", a), a_row, a_tile, tuple(m * w for m in heights),
                                 Access("b", b), b_tile, chunk, nt, Access("cs", cs), taps)]
                if chunk < steps:  # the rest of the reduction, chunk by chunk, added to C
                    on = Affine((("kc", chunk * AMX_STEP // 2),), chunk * AMX_STEP // 2)
                    gemms.append(dataclasses.replace(
                        gemms[0], a=Access("ws", _combine(a, on)),
                        b=Access("b", _combine(b, Affine((("kc", chunk * 256),),
                                                         chunk * 256))), accumulate=True))
                body: list = []
                for i, m in enumerate(heights):
                    row1 = row0 + i * th
                    for j in range(nt):
                        tile = Tile(f"g{len(tiles)}", (m, w), 1, mask)
                        tiles.append(tile)
                        o = Affine((("ko", o_ko), ("pr", mt * th * o_row), ("pc", tw * o_col)),
                                   con.out_offset(cfg) + at + row1 * o_row + col0 * o_col
                                   + j * LANES)
                        res = Affine((("ko", r_ko), ("pr", mt * th * r_row),
                                      ("pc", tw * r_col)),
                                     con.out_offset(rcfg) + r_at + row1 * r_row
                                     + col0 * r_col + j * LANES)
                        epi = epilogue_steps(c, kinds, o, (o_row, o_col), {"ko": kb}, cfg,
                                             first_channel=(first + j) * LANES,
                                             residual=(res, (r_row, r_col)))
                        body += [UpdateTile(tile.name,
                                            Access("cs", cs.offset((i * nt + j) * 256)),
                                            (w * LANES, LANES), None, SET),
                                 StoreTile(tile.name, Access("out", o), (o_row, o_col), epi)]
                split = (Split("pt", ("pr", "pc"), (nr, nc)),)
                pack = _block_pack(con, cfg, row, tiles, heights, th, w,
                                   Affine((("pr", mt * th),), row0),
                                   Affine((("pc", tw),), col0)) if fused_pack(cfg) else ()
                out.append(_blocks(cfg, {"ko": kb, "pt": nr * nc}, split, pack, gemms,
                                   steps // chunk, tuple(body)))
    return out, scratch


def _blocks(cfg, live: dict, split: tuple, pack: tuple, gemms: list, chunks: int,
            epilogue: tuple):
    """The block loops around the products and the epilogue. Over a reduction in
    `chunks` (and one parallel loop), the inner block loop turns inside the chunk loop:
    the outer block's operand chunk stays in cache while the inner's stream past, then
    the epilogue runs over the inner blocks. `pack` (the outer pixel block's fields)
    comes first."""
    first, rest = gemms[0], gemms[1:]
    if chunks == 1 or cfg["parallel"] != 1:
        body = (first,) + tuple(For("kc", chunks - 1, SERIAL, (g,)) for g in rest)
        if pack:
            return For("pt", live["pt"], PARALLEL,
                       split + pack + (For("ko", live["ko"], SERIAL, body + epilogue),))
        return gemm_outer(cfg, live, split + body + epilogue)
    outer, inner = cfg["spatial_order"]
    at_outer, at_inner = (split, ()) if outer == "pt" else ((), split)

    def turn(stmts: tuple) -> For:
        return For(inner, live[inner], SERIAL, at_inner + stmts)
    body = (turn((first,)), For("kc", chunks - 1, SERIAL, (turn(tuple(rest)),)),
            turn(epilogue))
    return For(outer, live[outer], PARALLEL, at_outer + pack + body)


def _block_pack(con: Conv2dContraction, cfg, row: int, tiles: list, heights: list,
                th: int, w: int, oh0: Affine, col: Affine) -> tuple:
    """The receptive fields of one block's pixels (rows from `oh0`, tile i's `heights[i]`
    of them th apart, `w` columns from `col`), rounded into their workspace rows, and the
    zeros past R."""
    cb = cfg["cb"]
    r = con.c * con.kh * con.kw
    out = []
    for i, m in enumerate(heights):
        oh = _combine(oh0, Affine((("rr", 1),), i * th))
        copy = _copy(con, cb, row, tiles, w, col, oh)
        stmts = (For("cq", con.c // cb, SERIAL, (For("kh", con.kh, SERIAL, (
            For("kw", con.kw, SERIAL, copy),)),)),)
        if 2 * row != r:
            zero = Tile(f"z{len(tiles)}", (1, w), (2 * row - r) // LANES)
            tiles.append(zero)
            at = _combine((oh, con.ow * row), (col, row), Affine((), r // 2))
            stmts += (ZeroTile(zero.name),
                      StoreTile(zero.name, Access("ws", at), (0, row), bf16=True))
        out.append(For("rr", m, SERIAL, stmts))
    return tuple(out)


def pack_amx(c: Compute, cfg, operands) -> dict[str, np.ndarray]:
    bufs = pack_operands(c, cfg, operands)
    for b in lower_amx(c, cfg).buffers:
        if b.role == "scratch":
            bufs[b.name] = np.zeros(b.size, np.float32)
    if c.op == "matmul":  # both operands as they come: rounded by the kernel
        return bufs
    con = view(c, cfg["ob"])
    w = operands[1]
    if c.op == "dense":  # [N][K] -> [Npad][K][1][1], zeros past N
        import torch
        w = torch.cat([w.detach(), w.new_zeros(con.k - w.shape[0], con.c)])[:, :, None, None]
    fields = cfg.get("fields", "im2col")
    if fields != "im2col":
        bufs["b"] = pack_weights(w, con, con.c, _rounded(con, fields)[1], per_tap=fields)
    else:
        bufs["b"] = pack_weights(w, con, cfg["cb"], _geometry(con)[1])
    return bufs


def pack_weights(w, con: Conv2dContraction, cb: int, row: int, per_tap: str = ""
                 ) -> np.ndarray:
    """[K'/16][R'/32][16 pairs][16 channels][2] bf16 of the weights, the reduction in
    ws's order, as float32 slots of two values: `row` slots of it, zeros past R, and K'
    channels, K padded to whole 16s with zeros (a masked last block's dead columns); with
    `per_tap` (the fields, direct or folded), a tap's run of values (C at each (kh, kw),
    or kw x C at each kh) padded to `row` slots (a rounded input pixel), tap after tap."""
    k, r = con.k, con.c * con.kh * con.kw
    kp = -(-k // LANES) * LANES
    if per_tap:
        taps = con.kh if per_tap == "folded" else con.kh * con.kw
        flat = np.zeros((kp, taps, 2 * row), np.float32)
        flat[:k, :, :r // taps] = w.detach().permute(0, 2, 3, 1).reshape(k, taps, -1).numpy()
        flat = flat.reshape(kp, -1)
        row = taps * row
    else:
        wr = w.detach().reshape(k, con.c // cb, cb, con.kh, con.kw).permute(0, 1, 3, 4, 2)
        flat = np.zeros((kp, 2 * row), np.float32)
        flat[:k, :r] = wr.reshape(k, r).numpy()
    vnni = flat.reshape(kp // LANES, LANES, 2 * row // AMX_STEP, AMX_STEP // 2, 2)
    vnni = vnni.transpose(0, 2, 3, 1, 4)  # tile, step, pair, channel, value of the pair
    return np.ascontiguousarray(to_bf16(np.ascontiguousarray(vnni))).view(np.float32).ravel()


def _lower_matmul(c: Compute, cfg) -> LoopNest:
    """y[b] = x[b] @ w[b], both operands activations: x's rows rounded into wa (K padded
    to a step's 32 with zeros), w's rows rounded two at a time into wb in the dot
    product's pair order ([N'/16][K'/2 pairs][16 columns][2] per batch, an odd K's last
    row paired with zeros, N's last block masked where 16 does not divide it), then blocks
    of mt tiles of 16 rows by nt x 16 columns on the tile registers, the epilogue from
    scratch into the row-major output (its last columns masked)."""
    con = MatmulContraction.from_compute(c)
    mt, nt, ob = cfg["mt"], cfg["nt"], cfg["ob"]
    if con is None or cfg["lanes"] != LANES or ob != LANES * nt or \
            -(-con.n // LANES) % nt or (con.n % LANES and nt != 1) or (mt, nt) not in SHAPES:
        raise ValueError(f"amx: config {cfg.to_json()} does not fit {c.describe()} (ob = "
                         f"{LANES}*nt, nt dividing N's blocks of {LANES}, 1 where a block "
                         f"is partial; (mt, nt) in {SHAPES})")
    bt, m, k, n = con.batch, con.m, con.k, con.n
    row = -(-k // AMX_STEP) * AMX_STEP // 2  # slots of a rounded row of x or pair column
    nb, tail = -(-n // LANES), n % LANES
    kb = nb // nt
    tiles: list[Tile] = []
    ahead = [_round_rows(bt * m, k, row, tiles), *_round_pairs(bt, k, n, row, tiles)]
    kinds = operand_kinds(c)
    out, scratch = [], 0
    for nr, rows, row0 in tile_variants(m, mt * AMX_ROWS):
        heights = [AMX_ROWS] * (rows // AMX_ROWS) + \
            ([rows % AMX_ROWS] if rows % AMX_ROWS else [])
        cap = len(heights) * nt * 256
        # the channel blocks in whole vectors, then the masked last one alone
        for first, count, mask in ((0, kb - bool(tail), 0), (kb - 1, int(bool(tail)), tail)):
            if not count:
                continue
            cs = Affine((("bt", nr * count * cap), ("pt", count * cap), ("ko", cap)),
                        scratch)
            scratch += bt * nr * count * cap
            a = Affine((("bt", m * row), ("pt", mt * AMX_ROWS * row)), row0 * row)
            b = Affine((("bt", nb * row * LANES), ("ko", nt * row * LANES)),
                       first * nt * row * LANES)
            body: list = [AmxGemm(Access("wa", a), row, AMX_ROWS * row, tuple(heights),
                                  Access("wb", b), row * LANES, 2 * row // AMX_STEP, nt,
                                  Access("cs", cs))]
            for i, h in enumerate(heights):
                for j in range(nt):
                    tile = Tile(f"g{len(tiles)}", (h, 1), 1, mask if j == nt - 1 else 0)
                    tiles.append(tile)
                    o = Affine((("bt", m * n), ("pt", mt * AMX_ROWS * n), ("ko", ob)),
                               (row0 + i * AMX_ROWS) * n + (first * nt + j) * LANES)
                    epi = epilogue_steps(c, kinds, o, (n, 0), {"ko": count}, cfg,
                                         first_channel=(first * nt + j) * LANES)
                    body += [UpdateTile(tile.name, Access("cs", cs.offset((i * nt + j) * 256)),
                                        (LANES, 0), None, SET),
                             StoreTile(tile.name, Access("out", o), (n, 0), epi)]
            out.append(gemm_outer(cfg, {"bt": bt, "ko": count, "pt": nr}, tuple(body)))
    bufs = [Buffer("a", bt * m * k, "in"), Buffer("b", bt * k * n, "in")]
    bufs += [Buffer(f"e{i}", n if kd.kind == "channel" else bt * m * n, "in")
             for i, kd in enumerate(kinds)]
    bufs += [Buffer("out", bt * m * n, "out"), Buffer("wa", bt * m * row, "scratch"),
             Buffer("wb", bt * nb * row * LANES, "scratch"), Buffer("cs", scratch, "scratch")]
    return LoopNest(f"k_{c.key()}_amx", tuple(bufs), tuple(tiles), tuple(ahead + out), LANES)


def _round_pairs(bt: int, k: int, n: int, row: int, tiles: list) -> list:
    """w's rows rounded into wb two at a time, interleaved in the dot product's pair
    order, per block of 16 columns (the last masked where 16 does not divide N: its dead
    lanes zero); an odd K's last row paired with zeros; the pairs past K zero."""
    nb, tail = -(-n // LANES), n % LANES
    out: list = []
    for rows, first, count in ((2, 0, k // 2), (1, k // 2, k % 2)):
        if not count:
            continue
        stmts: tuple = ()
        for blocks, mask, at in ((n // LANES, 0, 0), (int(bool(tail)), tail, n // LANES)):
            if not blocks:
                continue
            pair = Tile(f"p{len(tiles)}", (rows, 1), 1, mask)
            tiles.append(pair)
            src = Affine((("bt", k * n), ("p", 2 * n), ("nb", LANES)),
                         2 * first * n + at * LANES)
            dst = Affine((("bt", nb * row * LANES), ("nb", row * LANES), ("p", LANES)),
                         (at * row + first) * LANES)
            stmts += (For("nb", blocks, SERIAL, (
                UpdateTile(pair.name, Access("b", src), (n, 0), None, SET),
                StoreTile(pair.name, Access("wb", dst), (0, 0), bf16=True, pairs=True))),)
        out.append(For("q", bt * count, PARALLEL,
                       (Split("q", ("bt", "p"), (bt, count)),) + stmts))
    if 2 * row > k + k % 2:  # the pairs past K: zeros
        zero = Tile(f"z{len(tiles)}", (1, 1), 2)
        tiles.append(zero)
        at = Affine((("bt", nb * row * LANES), ("nb", row * LANES), ("zp", LANES)),
                    -(-k // 2) * LANES)
        out.append(For("q", bt * nb, PARALLEL, (
            Split("q", ("bt", "nb"), (bt, nb)),
            For("zp", row - -(-k // 2), SERIAL, (
                ZeroTile(zero.name), StoreTile(zero.name, Access("wb", at), (0, 0),
                                               bf16=True))))))
    return out


def _round_rows(count: int, k: int, row: int, tiles: list) -> For:
    """`count` rows of k floats from a, rounded into wa's rows of `row` slots, the values
    past k zero (a last vector's dead lanes are, as its masked load reads them)."""
    vecs = -(-k // LANES)
    tile = Tile(f"c{len(tiles)}", (1, 1), vecs, k % LANES)
    tiles.append(tile)
    stmts = (UpdateTile(tile.name, Access("a", Affine((("r", k),))), (0, 0), None, SET),
             StoreTile(tile.name, Access("wa", Affine((("r", row),))), (0, 0), bf16=True))
    if 2 * row > vecs * LANES:
        zero = Tile(f"z{len(tiles)}", (1, 1), (2 * row - vecs * LANES) // LANES)
        tiles.append(zero)
        stmts += (ZeroTile(zero.name), StoreTile(zero.name, Access(
            "wa", Affine((("r", row),), vecs * LANES // 2)), (0, 0), bf16=True))
    return For("r", count, PARALLEL, stmts)
