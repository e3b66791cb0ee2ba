"""lower(compute, config) -> LoopNest: one generic lowering for every contraction.

The epilogue operands become extra buffers: per-channel vectors (bias, batch-norm scale and
shift, broadcast channel operands) and full tensors in the output's layout (residuals).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.task import Compute, EpilogueOp
from raytune_kernels.cpu.contraction import contraction
from raytune_kernels.cpu.contraction_base import out_pad, res_pad, residual_cfg
from raytune_kernels.cpu.loopnest import (PARALLEL, SERIAL, UNROLL, Access, Affine, Buffer,
                                          EpiStep, UpdateTile, For, LoopNest, Split, StoreTile,
                                          Tile, ZeroTile)
from raytune_kernels.space import Config

if TYPE_CHECKING:
    import torch


class LoweringError(ValueError):
    """The compute/config pair cannot be lowered (named in the message)."""


@dataclass(frozen=True)
class OperandKind:
    """How one epilogue operand is laid out: per output channel, or like the output."""

    kind: str  # "channel" or "output"


def operand_kinds(compute: Compute) -> list[OperandKind]:
    """Layout of every epilogue tensor operand, in reference operand order."""
    kinds = []
    out = compute.output.shape
    for op in compute.epilogue:
        for spec in op.operands:
            kinds.append(OperandKind(_operand_kind(op, spec.shape, out, compute.op)))
    return kinds


# ops whose vector (channel) axis is dim 1 of an NCHW output; dense and matmul vectorise
# their last axis, whatever the rank (a per-head scale of attention scores is not one)
_NCHW_OPS = ("conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")


def _operand_kind(op: EpilogueOp, shape: tuple, out: tuple, anchor: str) -> str:
    if op.op in ("bias", "affine"):
        return "channel"
    if tuple(shape) == tuple(out):
        return "output"
    chan = 1 if len(out) == 4 and anchor in _NCHW_OPS else len(out) - 1
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    if all(s == 1 for i, s in enumerate(padded) if i != chan) and padded[chan] == out[chan]:
        return "channel"
    raise LoweringError(f"epilogue operand of shape {shape} broadcast to {out} "
                        f"({op.op}) has no supported layout")


def lower(compute: Compute, cfg: Config) -> LoopNest:
    con = contraction(compute)
    if con is None:
        raise LoweringError(f"no contraction lowering for {compute.describe()}")
    _validate(con, cfg)
    lanes, tw = cfg["lanes"], cfg["tile_w"]
    kinds = operand_kinds(compute)
    sizes = con.buffer_sizes(cfg)
    buffers = [Buffer("a", sizes["a"], "in")]
    buffers += [Buffer("b", sizes["b"], "in")] if con.has_b else []
    chan_len = con.channel_len(cfg)
    res_size = con.buffer_sizes(residual_cfg(cfg))["out"]
    for i, k in enumerate(kinds):
        buffers.append(Buffer(f"e{i}", chan_len if k.kind == "channel" else res_size, "in"))
    buffers.append(Buffer("out", sizes["out"], "out"))
    oh_ext, ow_ext = con.tile_extents
    tiles, body = [], []
    for rows in _runs(oh_ext, cfg["tile_h"]):  # whole tiles, then a shorter tail tile
        for cols in _runs(ow_ext, tw):
            for blocks, vecs, mask, first in _vector_runs(con, cfg):
                tile = Tile(f"t{len(tiles)}", (rows[1], cols[1]), vecs, mask)
                tiles.append(tile)
                body.extend(_nest(con, cfg, compute, kinds, tile, rows, cols,
                                  (blocks, first)))
    return LoopNest(f"k_{compute.key()}", tuple(buffers), tuple(tiles), tuple(body), lanes)


def _vector_runs(con, cfg: Config) -> list[tuple[int, int, int, int]]:
    """(blocks, vectors, mask, first block) of the vector blocks covering the output's
    vector axis: whole blocks of `ob`, then, where a contraction masks its vector axis
    (masks_vector) and `ob` does not divide it, one block of the remainder whose last
    vector has `mask` live lanes."""
    lanes, ob = cfg["lanes"], cfg["ob"]
    whole = con.extents(cfg)["ko"]
    if not con.masks_vector or con.vector_extent % ob == 0:
        return [(whole, ob // lanes, 0, 0)]
    rest = con.vector_extent % ob
    return ([(whole, ob // lanes, 0, 0)] if whole else []) + \
        [(1, -(-rest // lanes), rest % lanes, whole)]


def _runs(extent: int, step: int) -> list[tuple[int, int, int]]:
    """(count, size, offset) of the tiles covering `extent`: whole tiles of `step`, then
    one tile of the remainder where `step` does not divide it."""
    runs = [(extent // step, step, 0)] if extent >= step else []
    if extent % step:
        runs.append((1, extent % step, (extent // step) * step))
    return runs


def _validate(con, cfg: Config) -> None:
    """Reject configs that do not describe a kernel of this contraction, naming the knob."""
    problems = []
    if cfg["ob"] % cfg["lanes"]:
        problems.append(f"ob={cfg['ob']} is not a multiple of lanes={cfg['lanes']}")
    if not (con.pads_vector or con.masks_vector) and con.vector_extent % cfg["ob"]:
        problems.append(f"ob={cfg['ob']} does not divide {con.vector_extent}")
    elif con.masks_vector and con.out_layouts and con.vector_extent % cfg["ob"] and \
            cfg.get("out_layout", "blocked") != "nhwc":
        problems.append(f"ob={cfg['ob']} does not divide {con.vector_extent}: a masked "
                        "block is written NHWC only")
    if not 1 <= cfg["tile_h"] <= con.tile_extents[0]:
        problems.append(f"tile_h={cfg['tile_h']} outside 1..{con.tile_extents[0]}")
    if not 1 <= cfg["tile_w"] <= con.tile_extents[1]:
        problems.append(f"tile_w={cfg['tile_w']} outside 1..{con.tile_extents[1]}")
    if con.blocked_reduce and con.reduce_extent % cfg["cb"]:
        problems.append(f"cb={cfg['cb']} does not divide {con.reduce_extent}")
    if cfg.get("in_layout", "blocked") != "blocked" and not (
            cfg["in_layout"] == "nhwc" and hasattr(con, "reads_nhwc") and con.groups == 1):
        problems.append(f"in_layout={cfg['in_layout']!r}: only an ungrouped direct conv "
                        "reads its input NHWC in channel blocks ('nhwc')")
    if "in_pad" in dict(cfg.knobs) and not (hasattr(con, "in_offset") and
                                            con.pad == (0, 0)):
        problems.append(f"in_pad={cfg['in_pad']}: only a direct conv of no padding reads "
                        "its input inside a border")
    if problems:
        raise LoweringError(f"bad config for {con.op}: " + "; ".join(problems))


def _nest(con, cfg: Config, compute: Compute, kinds, tile: Tile, rows: tuple, cols: tuple,
          blocks: tuple[int, int]):
    """The loops of one tile shape: `rows` and `cols` are (count, size, offset) runs of
    the tiled output rows and columns (see _runs), `blocks` the (count, first) vector
    blocks (see _vector_runs)."""
    ext = dict(con.extents(cfg))
    ext["oh"], ext["ow"], ext["ko"] = rows[0], cols[0], blocks[0]
    live = {v: e for v, e in ext.items() if e > 1}
    base = con.strides(cfg)
    strides = _tile_strides(base, tile)
    a_idx, b_idx, o_idx = (_tile_index(con, cfg, live, base, strides, rows, cols, blocks, i)
                           for i in range(3))
    a_ts, o_ts = con.tile_strides(cfg)
    r_idx, r_ts = o_idx, o_ts  # residuals: the output's layout, in a buffer of their own
    if res_pad(cfg) != out_pad(cfg):  # whose border is not the output's
        rcfg = residual_cfg(cfg)
        r_base = con.strides(rcfg)
        r_idx = _tile_index(con, rcfg, live, r_base, _tile_strides(r_base, tile), rows, cols,
                            blocks, 2)
        r_ts = con.tile_strides(rcfg)[1]
    inner = _channel_block(con, cfg, tile, a_idx, b_idx, a_ts, strides)
    for var in reversed(cfg["reduce_order"]):
        if var in live:
            kind = UNROLL if (var == con.unrollable and cfg["unroll"]) else SERIAL
            inner = (For(var, live[var], kind, inner),)
    groups = con.vector_extent if "grp" in live else 0
    epilogue = con.pre_epilogue() + epilogue_steps(compute, kinds, o_idx, o_ts, live, cfg,
                                                   groups, blocks[1] * cfg["ob"],
                                                   (r_idx, r_ts))
    store = StoreTile(tile.name, Access("out", o_idx), o_ts, epilogue)
    stmts: tuple = (ZeroTile(tile.name, con.init),) + inner + (store,)
    return _spatial_loops(cfg, live, stmts)


def _tile_strides(base: dict, tile: Tile) -> dict:
    """The contraction's (A, B, output) strides per loop variable (`base`), a column step
    being a whole tile of columns."""
    return {**base, "ow": tuple(s * tile.shape[1] for s in base["ow"])}


def _tile_index(con, cfg: Config, live: dict, base: dict, strides: dict, rows: tuple,
                cols: tuple, blocks: tuple[int, int], which: int) -> Affine:
    """Operand `which`'s (0: A, 1: B, 2: output) index of a tile's first element: the
    tiles of `rows`, `cols` and `blocks` start at their offsets (`base` strides per
    column, row and block), and the output past its border."""
    row = base["oh"][which] // cfg["tile_h"]  # per output row
    const = base["ow"][which] * cols[2] + row * rows[2] + base["ko"][which] * blocks[1]
    if which == 2:
        const += con.out_offset(cfg)
    elif which == 0 and hasattr(con, "in_offset"):
        const += con.in_offset(cfg)
    return _affine(live, strides, which, const)


def _channel_block(con, cfg: Config, tile: Tile, a_idx: Affine, b_idx: Affine, a_ts,
                   strides: dict) -> tuple:
    """The innermost update, inside the channel-block loops: `ci` unrolled (up to 16) and
    `cio` over the rest of the block when the block is larger (cb = C for NHWC input)."""
    cb = cfg["cb"] if con.blocked_reduce else 1
    unroll = max(d for d in range(1, min(cb, 16) + 1) if cb % d == 0)
    a_in, b_in = a_idx, b_idx
    if con.blocked_reduce:
        for var, coef in (("ci", 1), ("cio", unroll)):
            a_in = a_in.plus(var, strides["ci"][0] * coef)
            b_in = b_in.plus(var, strides["ci"][1] * coef)
    b_access = Access("b", b_in) if con.has_b else None
    inner: tuple = (UpdateTile(tile.name, Access("a", a_in), a_ts, b_access, con.mode,
                               cfg.get("prefetch_b", 0)),)
    inner = (For("ci", unroll, UNROLL, inner),) if unroll > 1 else _fix(inner, "ci")
    return (For("cio", cb // unroll, SERIAL, inner),) if cb > unroll else _fix(inner, "cio")


def _fix(body: tuple, var: str) -> tuple:
    """A loop of extent 1 is not emitted: its variable is the constant 0."""
    return tuple(_drop_var(s, var) for s in body)


def _drop_var(s, var: str):
    if isinstance(s, For):
        return replace(s, body=_fix(s.body, var))
    if isinstance(s, UpdateTile):
        drop = lambda a: Access(a.buffer, Affine(tuple(t for t in a.index.terms  # noqa: E731
                                                         if t[0] != var), a.index.const))
        return replace(s, a=drop(s.a), b=drop(s.b) if s.b else None)
    return s


def _affine(live: dict, strides: dict, which: int, const: int) -> Affine:
    terms = tuple((v, strides[v][which]) for v in live if strides[v][which])
    return Affine(terms, const)


def _spatial_loops(cfg: Config, live: dict, stmts: tuple) -> list:
    order = [v for v in cfg["spatial_order"] if v in live]
    fused, rest = order[: cfg["parallel"]], order[cfg["parallel"]:]
    for var in reversed(rest):
        stmts = (For(var, live[var], SERIAL, stmts),)
    if not fused:
        return list(stmts)
    extents = tuple(live[v] for v in fused)
    split = (Split("p", tuple(fused), extents),)
    return [For("p", math.prod(extents), PARALLEL, split + stmts)]


def epilogue_steps(compute: Compute, kinds, o_idx: Affine, o_ts, live, cfg,
                   group_channels: int = 0, first_channel: int = 0,
                   residual: tuple | None = None) -> tuple:
    """Epilogue ops on the tile; channel operands are read at the output-channel block
    (first_channel + ko * ob, plus grp * channels-per-group for grouped convs), residuals
    at `residual` (index, tile strides) where their buffer has a border of its own
    (res_pad), else as the output is written."""
    r_idx, r_ts = residual or (o_idx, o_ts)
    steps, i = [], 0
    chan = Affine(tuple(t for t in (("ko", cfg["ob"]), ("grp", group_channels))
                        if t[0] in live and t[1]), first_channel)
    for op in compute.epilogue:
        operands = []
        for _ in op.operands:
            if kinds[i].kind == "channel":
                operands.append((Access(f"e{i}", chan), (0, 0)))
            else:
                operands.append((Access(f"e{i}", r_idx), r_ts))
            i += 1
        name = "add" if op.op == "bias" else op.op
        steps.append(EpiStep(name, tuple(operands), op.scalar, op.reverse))
    return tuple(steps)


def pack_operands(compute: Compute, cfg: Config, operands) -> dict[str, np.ndarray]:
    """Reference-order torch operands -> flat arrays in the kernel's layouts."""
    con = contraction(compute)
    bufs = {"a": con.pack_a(operands[0], cfg)}
    if con.has_b:
        bufs["b"] = con.pack_b(operands[1], cfg)
    chan_len = con.channel_len(cfg)
    rest = operands[len(compute.inputs):]
    for i, (kind, x) in enumerate(zip(operand_kinds(compute), rest)):
        if kind.kind == "channel":
            flat = np.zeros(chan_len, np.float32)
            flat[: x.numel()] = x.detach().reshape(-1).numpy()
            bufs[f"e{i}"] = flat
        else:
            bufs[f"e{i}"] = con.pack_out(x, residual_cfg(cfg))
    bufs["out"] = np.zeros(con.buffer_sizes(cfg)["out"], np.float32)
    return bufs


def unpack_output(compute: Compute, cfg: Config, flat: np.ndarray) -> torch.Tensor:
    return contraction(compute).unpack_out(flat, cfg)
