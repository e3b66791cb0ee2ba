"""Sliding-window computes on channel-blocked layouts: depthwise conv and pooling.

The vector axis is the channel block itself, so A is read as vectors: depthwise conv
multiplies them by weight vectors (vec_fma), max pooling takes their max (padding reads
-inf), average pooling sums them and scales in the epilogue.
input [C/OB][Hp][Wp][OB] (pre-padded), weight [C/OB][KH][KW][OB], output [C/OB][OH][OW][OB];
or, with the knob out_layout = "nhwc", input [Hp][Wp][C] and output [OH][OW][C] (the same
loops, the channel block read at its offset in each pixel's channels), so that a window
sits between 1x1 convs that read and write NHWC without a layout change either side.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.task import Compute
from raytune_kernels.cpu.contraction_base import (Contraction, as_blocks, out_pad,
                                                  written_layout)
from raytune_kernels.cpu.transform import Layout
from raytune_kernels.cpu.loopnest import ADD, MAX, VEC_FMA, EpiStep

if TYPE_CHECKING:
    import torch

_MODES = {"depthwise": VEC_FMA, "max": MAX, "avg": ADD}


@dataclass(frozen=True)
class WindowContraction(Contraction):
    kind: str  # "depthwise", "max" or "avg"
    c: int
    h: int
    w: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    dil: tuple[int, int]

    blocked_reduce = False
    masks_vector = True  # channels the block does not divide end in a masked block (NHWC)
    spatial = ("ko", "oh", "ow")
    reduce = ("kh", "kw")
    unrollable = "kw"
    out_layouts = ("blocked", "nhwc")  # the layout read and written: one knob for both

    @classmethod
    def from_compute(cls, c: Compute) -> "WindowContraction | None":
        n, ch, h, w = c.inputs[0].shape
        _, k, oh, ow = c.output.shape
        if c.op == "conv2d":
            if c.attr("groups") != ch or k != ch:
                return None  # grouped convs other than depthwise x1: not lowered yet
            kh, kw = c.inputs[1].shape[2:]
            kind, dil = "depthwise", c.attr("dilation")
        else:
            (kh, kw), kind = c.attr("kernel"), "max" if c.op == "max_pool2d" else "avg"
            dil = c.attr("dilation", (1, 1))
            if kind == "avg" and not c.attr("count_include_pad") and c.attr("padding") != (0, 0):
                return None  # a per-window divisor: not lowered yet
        self = cls(kind, ch, h, w, kh, kw, oh, ow, c.attr("stride"), c.attr("padding"), dil)
        hp, wp = self.padded()
        if (oh - 1) * self.stride[0] + (kh - 1) * dil[0] >= hp or \
                (ow - 1) * self.stride[1] + (kw - 1) * dil[1] >= wp:
            return None  # ceil_mode windows hanging off the padded input
        return self if n == 1 else None

    @property
    def op(self) -> str:
        return self.kind

    @property
    def mode(self) -> str:
        return _MODES[self.kind]

    @property
    def has_b(self) -> bool:
        return self.kind == "depthwise"

    @property
    def init(self) -> float:
        return float("-inf") if self.kind == "max" else 0.0

    def pre_epilogue(self) -> tuple:
        return (EpiStep("mul", scalar=1.0 / (self.kh * self.kw)),) if self.kind == "avg" else ()

    vector_extent = property(lambda self: self.c)
    tile_extents = property(lambda self: (self.oh, self.ow))
    reduce_extent = property(lambda self: None)

    def padded(self) -> tuple[int, int]:
        return self.h + 2 * self.pad[0], self.w + 2 * self.pad[1]

    def extents(self, cfg) -> dict[str, int]:
        return {"ko": self.c // cfg["ob"], "oh": self.oh // cfg["tile_h"], "kh": self.kh,
                "kw": self.kw}

    def block(self, cfg) -> int:
        """The channels of one pixel side by side in memory: the vector block, or all of
        them (NHWC)."""
        return self.c if cfg.get("out_layout", "blocked") == "nhwc" else cfg["ob"]

    def _out_dims(self, cfg) -> tuple[int, int]:
        """The output's stored rows and columns: with its border (out_pad) when it has one."""
        ph, pw = out_pad(cfg)
        return self.oh + 2 * ph, self.ow + 2 * pw

    def strides(self, cfg) -> dict[str, tuple[int, int, int]]:
        ob, th, px = cfg["ob"], cfg["tile_h"], self.block(cfg)
        hp, wp = self.padded()
        ohp, owp = self._out_dims(cfg)
        (sh, sw), (dh, dw) = self.stride, self.dil
        b = self.has_b
        nhwc = cfg.get("out_layout", "blocked") == "nhwc"  # the next block: in the pixel
        a_ko, o_ko = (ob, ob) if nhwc else (hp * wp * ob, ohp * owp * ob)
        return {"ko": (a_ko, b * self.kh * self.kw * ob, o_ko),
                "oh": (th * sh * wp * px, 0, th * owp * px), "ow": (sw * px, 0, px),
                "kh": (dh * wp * px, b * self.kw * ob, 0), "kw": (dw * px, b * ob, 0)}

    def tile_strides(self, cfg):
        _, wp = self.padded()
        px, (_, owp) = self.block(cfg), self._out_dims(cfg)
        return ((self.stride[0] * wp * px, self.stride[1] * px), (owp * px, px))

    def out_offset(self, cfg) -> int:
        ph, pw = out_pad(cfg)
        return (ph * self._out_dims(cfg)[1] + pw) * self.block(cfg)

    def out_layout(self, cfg) -> Layout:
        """The output's layout, its border included."""
        return written_layout(cfg)

    def cpad(self, cfg) -> int:
        """Channels with the weights' last block padded whole."""
        return -(-self.c // cfg["ob"]) * cfg["ob"]

    def buffer_sizes(self, cfg) -> dict[str, int]:
        hp, wp = self.padded()
        return {"a": self.c * hp * wp, "b": self.cpad(cfg) * self.kh * self.kw,
                "out": self.out_layout(cfg).size((1, self.c, self.oh, self.ow))}

    def pack_a(self, x: torch.Tensor, cfg) -> np.ndarray:
        """The input in the output's layout, its padding as a border (-inf for max)."""
        lay = Layout(self.out_layout(cfg).name, self.pad)
        return lay.pack(x.reshape(1, self.c, self.h, self.w),
                        float("-inf") if self.kind == "max" else 0.0)

    def pack_b(self, w: torch.Tensor, cfg) -> np.ndarray:
        import torch
        ob, cp = cfg["ob"], self.cpad(cfg)
        w = w.reshape(self.c, self.kh, self.kw)
        if cp != self.c:  # a masked last block: its weights padded with zeros
            w = torch.cat([w, w.new_zeros((cp - self.c, self.kh, self.kw))])
        return as_blocks(w.reshape(cp // ob, ob, self.kh, self.kw).permute(0, 2, 3, 1)).ravel()

    def pack_out(self, y: torch.Tensor, cfg) -> np.ndarray:
        return self.out_layout(cfg).pack(y.reshape(1, self.c, self.oh, self.ow))

    def unpack_out(self, flat: np.ndarray, cfg) -> torch.Tensor:
        return self.out_layout(cfg).unpack(flat, (1, self.c, self.oh, self.ow))

    def flops(self) -> int:
        per_tap = 2 if self.kind == "depthwise" else 1
        return per_tap * self.c * self.oh * self.ow * self.kh * self.kw
