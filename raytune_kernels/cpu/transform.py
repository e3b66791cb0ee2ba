"""Layout-transform kernels (NCHW <-> NHWC <-> NCHW[x]c) from the same tile machinery.

A transform is a copy: a tile of (channel block x columns) scalars is loaded from the
source layout and stored in the destination layout. The channel axis is split as
c = cq*B + cr*blk + ci, B the larger and blk the smaller block of the two layouts, so that
every layout's index is affine in the loop variables. The layout ILP times these.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.cpu.loopnest import (PARALLEL, SERIAL, SET, Access, Affine, Buffer, For,
                                          LoopNest, Split, StoreTile, Tile, UpdateTile)
from raytune_kernels.space import Config, Space

if TYPE_CHECKING:
    import torch

_BLOCKED = re.compile(r"^NCHW(\d+)c$")


@dataclass(frozen=True)
class Layout:
    """NCHW, NHWC or NCHW{x}c for a batch-1 4-D tensor, optionally stored with a spatial
    border of `pad` (rows, columns) on each side, as conv kernels read their input. A
    transform writes only the interior; the border is set when the buffer is made (zeros,
    or -inf before a max pool), and written again before each writer only where the
    buffer's memory also serves other values (cpu/border.py)."""

    name: str
    pad: tuple[int, int] = (0, 0)

    @classmethod
    def parse(cls, label: str) -> "Layout":
        """A layout from its label: NCHW, NHWC, NCHW16c, or with a border NCHW16c/p1x1."""
        name, _, border = label.partition("/p")
        if not border:
            return cls(name)
        try:
            ph, pw = (int(v) for v in border.split("x"))
        except ValueError:
            raise ValueError(f"bad layout label {label!r} (e.g. NCHW16c/p1x1)") from None
        return cls(name, (ph, pw))

    @property
    def label(self) -> str:
        return self.name + (f"/p{self.pad[0]}x{self.pad[1]}" if self.pad != (0, 0) else "")

    @property
    def block(self) -> int | None:
        m = _BLOCKED.match(self.name)
        return int(m.group(1)) if m else None

    def check(self, channels: int) -> None:
        if self.name not in ("NCHW", "NHWC") and self.block is None:
            raise ValueError(f"unknown layout {self.name!r} (NCHW, NHWC or NCHW<x>c)")
        if self.block and channels % self.block:
            raise ValueError(f"layout {self.name} needs channels divisible by {self.block}, "
                             f"got {channels}")

    def size(self, shape: tuple[int, ...]) -> int:
        _, c, h, w = shape
        return c * (h + 2 * self.pad[0]) * (w + 2 * self.pad[1])

    def pack(self, x: torch.Tensor, border: float = 0.0) -> np.ndarray:
        """A (1, C, H, W) tensor in this layout, flat (the border filled with `border`)."""
        import torch
        if self.pad != (0, 0):
            x = torch.nn.functional.pad(x, (self.pad[1],) * 2 + (self.pad[0],) * 2,
                                        value=border)
        c, h, w = x.shape[1:]
        if self.name == "NCHW":
            y = x[0]
        elif self.name == "NHWC":
            y = x[0].permute(1, 2, 0)
        else:
            y = x[0].reshape(c // self.block, self.block, h, w).permute(0, 2, 3, 1)
        return np.ascontiguousarray(y.detach().numpy(), np.float32).ravel()

    def unpack(self, flat: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
        import torch
        (ph, pw), (_, c, h, w) = self.pad, shape
        hs, ws = h + 2 * ph, w + 2 * pw
        t = torch.from_numpy(flat.copy())
        if self.name == "NCHW":
            full = t.reshape(1, c, hs, ws)
        elif self.name == "NHWC":
            full = t.reshape(hs, ws, c).permute(2, 0, 1).reshape(1, c, hs, ws)
        else:
            b = self.block
            full = t.reshape(c // b, hs, ws, b).permute(0, 3, 1, 2).reshape(1, c, hs, ws)
        return full[:, :, ph:ph + h, pw:pw + w].contiguous()

    def offset(self, c: int, h: int, w: int, big: int, blk: int) -> int:
        """Where element (0, 0, 0) lives: past the border."""
        st = self.strides(c, h, w, big, blk)
        return self.pad[0] * st["h"] + self.pad[1] * st["w"]

    def strides(self, c: int, h: int, w: int, big: int, blk: int) -> dict[str, int]:
        """Element strides of the loop variables cq, cr, ci, h, w in this layout."""
        h, w = h + 2 * self.pad[0], w + 2 * self.pad[1]  # storage dims
        if self.block is None:
            s_c = h * w if self.name == "NCHW" else 1
            s_h, s_w = (w, 1) if self.name == "NCHW" else (w * c, c)
            return {"cq": big * s_c, "cr": blk * s_c, "ci": s_c, "h": s_h, "w": s_w}
        x = self.block
        if x == big:
            return {"cq": h * w * x, "cr": blk, "ci": 1, "h": w * x, "w": x}
        return {"cq": (big // x) * h * w * x, "cr": h * w * x, "ci": 1, "h": w * x, "w": x}


def blocks(c: int, src: Layout, dst: Layout) -> tuple[int, int]:
    given = [b for b in (src.block, dst.block) if b]
    if not given:
        small = max(d for d in range(1, 17) if c % d == 0)
        return small, small
    big, blk = max(given), min(given)
    if big % blk:
        raise ValueError(f"cannot transform between blocks {src.block} and {dst.block}")
    return big, blk


def transform_space(shape: tuple[int, ...], src: str, dst: str) -> Space:
    w = shape[3]
    widths = tuple(t for t in (1, 2, 4, 7, 8, 14, 16) if t <= w)
    return Space(("tile_w",), tuple((t,) for t in widths), (("parallel", (True, False)),))


def transform_nest(shape: tuple[int, ...], src: "str | Layout", dst: "str | Layout",
                   cfg: Config) -> LoopNest:
    _, c, h, w = shape
    s = src if isinstance(src, Layout) else Layout(src)
    d = dst if isinstance(dst, Layout) else Layout(dst)
    s.check(c)
    d.check(c)
    big, blk = blocks(c, s, d)
    ss, ds = s.strides(c, h, w, big, blk), d.strides(c, h, w, big, blk)
    tw = min(cfg["tile_w"], w)
    ext = {"cq": c // big, "cr": big // blk, "h": h}
    variants = [(w // tw, tw, 0)] + ([(1, w % tw, (w // tw) * tw)] if w % tw else [])
    tiles, body = [], []
    for n, (count, width, offset) in enumerate(variants):
        tile = Tile(f"t{n}", (blk, width), 1)
        tiles.append(tile)
        live = {**ext, "wt": count}
        a0 = s.offset(c, h, w, big, blk) + ss["w"] * offset
        o0 = d.offset(c, h, w, big, blk) + ds["w"] * offset
        a = Affine(tuple((v, ss[v] if v != "wt" else ss["w"] * width) for v in live), a0)
        o = Affine(tuple((v, ds[v] if v != "wt" else ds["w"] * width) for v in live), o0)
        stmts = (UpdateTile(tile.name, Access("src", a), (ss["ci"], ss["w"]), None, SET),
                 StoreTile(tile.name, Access("dst", o), (ds["ci"], ds["w"])))
        body.append(_loops(live, stmts, cfg["parallel"], cfg.get("rows_first", False)))
    tag = "_".join(f"{x.name}p{x.pad[0]}x{x.pad[1]}" for x in (s, d))
    name = f"transform_{tag}_{'x'.join(map(str, shape))}"
    bufs = (Buffer("src", s.size(shape), "in"), Buffer("dst", d.size(shape), "out"))
    return LoopNest(name, bufs, tuple(tiles), tuple(body), 1)


def _loops(live: dict, stmts: tuple, parallel: bool, rows_first: bool = False):
    """The copy's loops; parallel, the threads take contiguous shares of the channel
    blocks, then rows, or with `rows_first` bands of rows (compile/cpu_plan.py's
    copies_by_rows picks, from how the value's producer and reader split theirs)."""
    inner = (For("wt", live["wt"], SERIAL, stmts),)
    outer = ("h", "cq", "cr") if rows_first else ("cq", "cr", "h")
    if parallel:
        extents = tuple(live[v] for v in outer)
        return For("p", math.prod(extents), PARALLEL, (Split("p", outer, extents),) + inner)
    for v in reversed(outer):
        inner = (For(v, live[v], SERIAL, inner),)
    return inner[0]


def strided_nest(size: int, out_shape: tuple[int, ...], strides: tuple[int, ...],
                 offset: int, lanes: int) -> LoopNest:
    """A contiguous copy of the view of a flat source of `size` floats that has `out_shape`,
    `strides` and `offset` (in floats): a permute, a basic index or slice, an expand (stride
    0), run natively inside the network (a PyTorch copy between native kernels woke
    PyTorch's own thread pool, whose threads and ours then took turns at the cores). Where
    the last axis is contiguous in the source, each tile row is a run of `lanes`-float
    vectors, copied whole; otherwise a tile of scalars reads along an axis contiguous in
    the source and writes along the last. Every loop but the innermost is shared out."""
    n = len(out_shape)
    if n == 0 or len(strides) != n or not math.prod(out_shape):
        raise ValueError(f"strided copy: shape {out_shape} and strides {strides}")
    src = list(strides)
    dst = [math.prod(out_shape[i + 1:]) for i in range(n)]
    c = n - 1  # the destination's contiguous axis: a tile's columns, or its vector runs
    vector = src[c] == 1 and lanes > 1 and out_shape[c] % lanes == 0
    if vector:
        r = n - 2 if n > 1 else None
        vecs = max(v for v in (1, 2, 4) if out_shape[c] // lanes % v == 0)
        cols, col_count = 1, out_shape[c] // (vecs * lanes)
        col_step = vecs * lanes
    else:
        lanes, vecs = 1, 1
        unit = [i for i in range(n - 1) if src[i] == 1]
        r = unit[-1] if unit else (n - 2 if n > 1 else None)
        cols = _divisor_at_most(out_shape[c], 16)
        col_count, col_step = out_shape[c] // cols, cols
    rows = _divisor_at_most(out_shape[r], 8) if r is not None else 1
    loops = [(f"d{i}", out_shape[i], src[i], dst[i]) for i in range(n) if i not in (r, c)]
    if r is not None:
        loops.append(("rt", out_shape[r] // rows, src[r] * rows, dst[r] * rows))
    loops.append(("ct", col_count, src[c] * col_step, dst[c] * col_step))
    a = Affine(tuple((v, s) for v, _, s, _ in loops), offset)
    o = Affine(tuple((v, d) for v, _, _, d in loops))
    r_src, r_dst = (src[r], dst[r]) if r is not None else (0, 0)
    tile = Tile("t", (rows, cols), vecs)
    stmts = (UpdateTile("t", Access("src", a), (r_src, src[c]), None, SET),
             StoreTile("t", Access("dst", o), (r_dst, dst[c])))
    body = (For("ct", col_count, SERIAL, stmts),)
    outer = [(v, e) for v, e, _, _ in loops[:-1]]
    if outer:
        names, extents = tuple(v for v, _ in outer), tuple(e for _, e in outer)
        body = (For("p", math.prod(extents), PARALLEL, (Split("p", names, extents),) + body),)
    what = hashlib.sha256(repr((size, out_shape, strides, offset, lanes)).encode())
    name = f"strided_{n}d_{what.hexdigest()[:16]}"
    bufs = (Buffer("src", size, "in"), Buffer("dst", math.prod(out_shape), "out"))
    return LoopNest(name, bufs, (tile,), body, lanes)


def concat_nest(shapes: list[tuple[int, ...]], dim: int, lanes: int) -> LoopNest:
    """torch.cat of contiguous tensors of `shapes` along `dim`, into a contiguous output:
    each input is rows (the axes before `dim`) of one contiguous run, copied into its slice
    of each output row in vectors of the widest of `lanes`, 8 or 4 floats that divides
    every run (else a tile of scalars); the rows are shared out."""
    n = len(shapes[0])
    dim %= max(n, 1)
    if len(shapes) < 2 or any(len(s) != n or s[:dim] + s[dim + 1:] !=
                              shapes[0][:dim] + shapes[0][dim + 1:] for s in shapes):
        raise ValueError(f"concat: shapes {shapes} are not two or more that differ only on "
                         f"axis {dim}")
    outer, inner = math.prod(shapes[0][:dim]), math.prod(shapes[0][dim + 1:])
    runs = [s[dim] * inner for s in shapes]
    row = sum(runs)  # floats of an output row
    width = max(w for w in (lanes, 8, 4, 1) if w <= lanes and all(r % w == 0 for r in runs))
    rows = _divisor_at_most(outer, 8)
    tiles, body, at = [], [], 0
    for k, run in enumerate(runs):
        if width > 1:
            vecs = max(v for v in (1, 2, 4) if run // width % v == 0)
            cols, step = 1, vecs * width
        else:
            vecs, cols = 1, _divisor_at_most(run, 16)
            step = cols
        tile = Tile(f"t{k}", (rows, cols), vecs)
        tiles.append(tile)
        a = Affine((("rt", rows * run), ("ct", step)))
        o = Affine((("rt", rows * row), ("ct", step)), at)
        copy = For("ct", run // step, SERIAL, (
            UpdateTile(tile.name, Access(f"src{k}", a), (run, 1), None, SET),
            StoreTile(tile.name, Access("dst", o), (row, 1))))
        body.append(For("rt", outer // rows, PARALLEL, (copy,)))
        at += run
    what = hashlib.sha256(repr((shapes, dim, width)).encode()).hexdigest()[:16]
    name = f"concat_{len(shapes)}_{what}"  # the shapes themselves make too long a file name
    bufs = tuple(Buffer(f"src{k}", math.prod(s), "in") for k, s in enumerate(shapes)) + \
        (Buffer("dst", outer * row, "out"),)
    return LoopNest(name, bufs, tuple(tiles), tuple(body), width)


def _divisor_at_most(x: int, most: int) -> int:
    return max(d for d in range(1, min(x, most) + 1) if x % d == 0)
