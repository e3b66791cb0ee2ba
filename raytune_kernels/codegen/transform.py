"""Layout-transform kernels (NCHW <-> NHWC <-> NCHW[x]c) from the same tile machinery.

A transform is a copy: a tile of (channel block x columns) scalars is loaded from the
source layout and stored in the destination layout. The channel axis is split as
c = cq*B + cr*blk + ci, B the larger and blk the smaller block of the two layouts, so that
every layout's index is affine in the loop variables. The layout ILP times these.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch

from .loopnest import (PARALLEL, SERIAL, SET, Access, Affine, Buffer, For, LoopNest, Split,
                       StoreTile, Tile, UpdateTile)
from .space import Config, Space

_BLOCKED = re.compile(r"^NCHW(\d+)c$")


@dataclass(frozen=True)
class Layout:
    """NCHW, NHWC or NCHW{x}c for a batch-1 4-D tensor."""

    name: str

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

    def pack(self, x: torch.Tensor) -> np.ndarray:
        """A (1, C, H, W) tensor in this layout, flat."""
        c, h, w = x.shape[1:]
        if self.name == "NCHW":
            y = x[0]
        elif self.name == "NHWC":
            y = x[0].permute(1, 2, 0)
        else:
            y = x[0].reshape(c // self.block, self.block, h, w).permute(0, 2, 3, 1)
        return np.ascontiguousarray(y.detach().numpy(), np.float32).ravel()

    def unpack(self, flat: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
        _, c, h, w = shape
        t = torch.from_numpy(flat.copy())
        if self.name == "NCHW":
            return t.reshape(shape)
        if self.name == "NHWC":
            return t.reshape(h, w, c).permute(2, 0, 1).reshape(shape).contiguous()
        b = self.block
        return t.reshape(c // b, h, w, b).permute(0, 3, 1, 2).reshape(shape).contiguous()

    def strides(self, c: int, h: int, w: int, big: int, blk: int) -> dict[str, int]:
        """Element strides of the loop variables cq, cr, ci, h, w in this layout."""
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


def transform_nest(shape: tuple[int, ...], src: str, dst: str, cfg: Config) -> LoopNest:
    _, c, h, w = shape
    s, d = Layout(src), Layout(dst)
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
        a = Affine(tuple((v, ss[v] if v != "wt" else ss["w"] * width) for v in live), ss["w"] * offset)
        o = Affine(tuple((v, ds[v] if v != "wt" else ds["w"] * width) for v in live), ds["w"] * offset)
        stmts = (UpdateTile(tile.name, Access("src", a), (ss["ci"], ss["w"]), None, SET),
                 StoreTile(tile.name, Access("dst", o), (ds["ci"], ds["w"])))
        body.append(_loops(live, stmts, cfg["parallel"]))
    n = math.prod(shape)
    name = f"transform_{src}_{dst}_{'x'.join(map(str, shape))}"
    return LoopNest(name, (Buffer("src", n, "in"), Buffer("dst", n, "out")), tuple(tiles),
                    tuple(body), 1)


def _loops(live: dict, stmts: tuple, parallel: bool):
    inner = (For("wt", live["wt"], SERIAL, stmts),)
    outer = ("cq", "cr", "h")
    if parallel:
        extents = tuple(live[v] for v in outer)
        return For("p", math.prod(extents), PARALLEL, (Split("p", outer, extents),) + inner)
    for v in reversed(outer):
        inner = (For(v, live[v], SERIAL, inner),)
    return inner[0]
