"""Computes seen as register-tiled contractions, with the data layouts each config implies.

A contraction has spatial loops (one of them carries the output vector block, one or two are
tiled into the register tile) and reduction loops (one of them is blocked and its block is
unrolled innermost). The schedule space is generated from these facts by rules (space.py),
and one generic lowering (lower.py) turns any contraction and config into a loop nest. What
is op-specific lives here: the loops, the packed layouts and the affine strides.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.task import Compute
from raytune_kernels.cpu.contraction_base import (Contraction, as_blocks, out_pad,
                                                  written_layout)
from raytune_kernels.cpu.transform import Layout

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Conv2dContraction(Contraction):
    """Direct conv2d in blocked layouts; grouped convs add a loop over groups.

    input  [C/CB][Hp][Wp][CB] (pre-padded), weight [K/OB][Cg/CB][KH][KW][CB][OB],
    output [K/OB][OH][OW][OB] (or NHWC): NCHW[CB]c in, NCHW[OB]c out. Cg = C/groups; the
    blocks CB and OB divide a group's channels, so no block straddles two groups.

    With the knob in_layout="nhwc" (one group only) the input is NHWC, [Hp][Wp][C], read a
    block of CB channels at a time: the same loops and weights, the input's pixels C apart
    instead of CB. compile_network sets it where the input would otherwise be copied from
    NHWC into NCHW[CB]c (compile/cpu_plan.nhwc_reads); the search never tunes it. With the
    knob in_pad (a conv of no padding) the input lives inside a border another reader of
    it wants, and the kernel reads the interior; compile_network sets that one too.
    """

    n: int
    c: int
    h: int
    w: int
    k: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    dil: tuple[int, int]
    groups: int = 1

    op = "conv2d"
    # one group: output channels the block does not divide (24 or 40 at 16 lanes; the
    # frontend pads counts to whole 8-lane vectors) end in a masked block
    masks_vector = property(lambda self: self.groups == 1)

    @classmethod
    def from_compute(cls, c: Compute) -> "Conv2dContraction":
        n, ch, h, w = c.inputs[0].shape
        k, _, kh, kw = c.inputs[1].shape
        _, _, oh, ow = c.output.shape
        return cls(n, ch, h, w, k, kh, kw, oh, ow, c.attr("stride"), c.attr("padding"),
                   c.attr("dilation"), c.attr("groups"))

    # facts the space rules use (per group: the vector and reduction extents)
    vector_extent = property(lambda self: self.k // self.groups)
    tile_extents = property(lambda self: (self.oh, self.ow))
    reduce_extent = property(lambda self: self.c // self.groups)
    reduce = ("co", "kh", "kw")

    @property
    def spatial(self) -> tuple[str, ...]:
        return ("grp", "ko", "oh", "ow") if self.groups > 1 else ("ko", "oh", "ow")

    def channel_len(self, cfg) -> int:
        return self.k
    unrollable = "kw"

    def in_border(self, cfg=None) -> tuple[int, int]:
        """The border around the input in its buffer: the conv's own padding, or the
        larger border of the buffer it reads the interior of (knob in_pad)."""
        return tuple(cfg.get("in_pad", self.pad)) if cfg is not None else self.pad

    def padded(self, cfg=None) -> tuple[int, int]:
        bh, bw = self.in_border(cfg)
        return self.h + 2 * bh, self.w + 2 * bw

    def in_offset(self, cfg) -> int:
        """Where the input's first read element lies in its buffer: past the part of the
        border the conv does not read (in_pad beyond its padding)."""
        (bh, bw), (ph, pw) = self.in_border(cfg), self.pad
        return ((bh - ph) * self.padded(cfg)[1] + bw - pw) * self.in_steps(cfg)[1]

    def extents(self, cfg) -> dict[str, int]:
        return {"grp": self.groups, "ko": self.vector_extent // cfg["ob"],
                "oh": self.oh // cfg["tile_h"], "co": self.reduce_extent // cfg["cb"],
                "kh": self.kh, "kw": self.kw}

    def reads_nhwc(self, cfg) -> bool:
        """Whether the input is NHWC read in blocks of cb (knob in_layout), not NCHW[cb]c."""
        return cfg.get("in_layout", "blocked") == "nhwc"

    def in_steps(self, cfg) -> tuple[int, int]:
        """Input strides of (channel block, pixel) in its padded buffer."""
        cb = cfg["cb"]
        if self.reads_nhwc(cfg):
            return cb, self.c
        hp, wp = self.padded(cfg)
        return hp * wp * cb, cb

    def strides(self, cfg) -> dict[str, tuple[int, int, int]]:
        """Per loop variable: (A stride, B stride, output stride) in elements."""
        cb, ob = cfg["cb"], cfg["ob"]
        hp, wp = self.padded(cfg)
        (sh, sw), (dh, dw) = self.stride, self.dil
        a_co, px = self.in_steps(cfg)
        nco = self.reduce_extent // cb
        w_kw = cb * ob
        w_kh = self.kw * w_kw
        w_co = self.kh * w_kh
        o_ko, o_row, o_col = self.out_steps(cfg)
        kob = self.vector_extent // ob  # output-channel blocks per group
        return {
            "grp": (self.reduce_extent * hp * wp, kob * nco * w_co, kob * o_ko),
            "ko": (0, nco * w_co, o_ko),
            "oh": (cfg["tile_h"] * sh * wp * px, 0, cfg["tile_h"] * o_row),
            "ow": (sw * px, 0, o_col),  # per output column (times the tile width by lower)
            "co": (a_co, w_co, 0), "kh": (dh * wp * px, w_kh, 0),
            "kw": (dw * px, w_kw, 0), "ci": (1, ob, 0),
        }

    def out_steps(self, cfg) -> tuple[int, int, int]:
        """Output strides of (channel block, row, column) for the chosen output layout,
        in a buffer with its border (out_pad) when it has one."""
        ob, (ph, pw) = cfg["ob"], out_pad(cfg)
        ohp, owp = self.oh + 2 * ph, self.ow + 2 * pw
        if cfg.get("out_layout", "blocked") == "nhwc":
            return ob, owp * self.k, self.k
        return ohp * owp * ob, owp * ob, ob

    def out_offset(self, cfg) -> int:
        ph, pw = out_pad(cfg)
        return (ph * (self.ow + 2 * pw) + pw) * self.out_steps(cfg)[2]

    def out_layout(self, cfg) -> Layout:
        """The output's layout, its border included."""
        return written_layout(cfg)

    def tile_strides(self, cfg) -> tuple[tuple[int, int], tuple[int, int]]:
        """(A strides, output strides) between the register tile's rows and columns."""
        hp, wp = self.padded(cfg)
        _, o_row, o_col = self.out_steps(cfg)
        px = self.in_steps(cfg)[1]
        return ((self.stride[0] * wp * px, self.stride[1] * px), (o_row, o_col))

    def kpad(self, cfg) -> int:
        """Output channels with the weights' last block padded whole."""
        return -(-self.k // cfg["ob"]) * cfg["ob"]

    def buffer_sizes(self, cfg) -> dict[str, int]:
        hp, wp = self.padded(cfg)
        weights = self.kpad(cfg) * self.reduce_extent * self.kh * self.kw
        return {"a": self.c * hp * wp, "b": weights,
                "out": self.out_layout(cfg).size((1, self.k, self.oh, self.ow))}

    def channel_axis(self) -> int:
        return 1

    # layouts
    def pack_a(self, x: torch.Tensor, cfg) -> np.ndarray:
        import torch
        cb, (bh, bw) = cfg["cb"], self.in_border(cfg)
        xp = torch.nn.functional.pad(x[0], (bw,) * 2 + (bh,) * 2)
        hp, wp = self.padded(cfg)
        if self.reads_nhwc(cfg):
            return as_blocks(xp.permute(1, 2, 0)).ravel()
        return as_blocks(xp.reshape(self.c // cb, cb, hp, wp).permute(0, 2, 3, 1)).ravel()

    def pack_b(self, w: torch.Tensor, cfg) -> np.ndarray:
        import torch
        cb, ob, kp = cfg["cb"], cfg["ob"], self.kpad(cfg)
        if kp != self.k:  # a masked last block: its weights padded with zeros
            w = torch.cat([w, w.new_zeros((kp - self.k,) + tuple(w.shape[1:]))])
        v = w.reshape(kp // ob, ob, self.reduce_extent // cb, cb, self.kh, self.kw)
        return as_blocks(v.permute(0, 2, 4, 5, 3, 1)).ravel()

    def pack_out(self, y: torch.Tensor, cfg) -> np.ndarray:
        return self.out_layout(cfg).pack(y.reshape(1, self.k, self.oh, self.ow))

    def unpack_out(self, flat: np.ndarray, cfg) -> torch.Tensor:
        return self.out_layout(cfg).unpack(flat, (1, self.k, self.oh, self.ow))

    def flops(self) -> int:
        return 2 * self.k * self.oh * self.ow * self.reduce_extent * self.kh * self.kw

    out_layouts = ("blocked", "nhwc")


@dataclass(frozen=True)
class DenseContraction(Contraction):
    """Dense y[M, N] = x[M, K] @ w[N, K]^T with weights packed [Np/NB][K][NB].

    The output is [M][Np] with N padded up to a multiple of the vector block; the padding
    columns hold zeros-weight results and are dropped on unpacking.
    """

    m: int
    k: int
    n: int
    lead: tuple[int, ...]

    op = "dense"
    pads_vector = True
    spatial = ("ko", "oh")
    reduce = ("co",)
    unrollable = None

    @classmethod
    def from_compute(cls, c: Compute) -> "DenseContraction":
        shape = c.inputs[0].shape
        return cls(math.prod(shape[:-1]), shape[-1], c.inputs[1].shape[0], tuple(shape[:-1]))

    vector_extent = property(lambda self: self.n)
    tile_extents = property(lambda self: (self.m, 1))
    reduce_extent = property(lambda self: self.k)

    def npad(self, cfg) -> int:
        return -(-self.n // cfg["ob"]) * cfg["ob"]

    def channel_len(self, cfg) -> int:
        return self.npad(cfg)

    def extents(self, cfg) -> dict[str, int]:
        return {"ko": self.npad(cfg) // cfg["ob"], "oh": self.m // cfg["tile_h"],
                "co": self.k // cfg["cb"]}

    def strides(self, cfg) -> dict[str, tuple[int, int, int]]:
        ob, cb, npad = cfg["ob"], cfg["cb"], self.npad(cfg)
        return {"ko": (0, self.k * ob, ob), "oh": (cfg["tile_h"] * self.k, 0,
                                                   cfg["tile_h"] * npad),
                "ow": (0, 0, 0), "co": (cb, cb * ob, 0), "ci": (1, ob, 0)}

    def tile_strides(self, cfg):
        return ((self.k, 0), (self.npad(cfg), 0))

    def buffer_sizes(self, cfg) -> dict[str, int]:
        return {"a": self.m * self.k, "b": self.npad(cfg) * self.k,
                "out": self.m * self.npad(cfg)}

    def channel_axis(self) -> int:
        return -1

    def pack_a(self, x: torch.Tensor, cfg) -> np.ndarray:
        return as_blocks(x.reshape(self.m, self.k)).ravel()

    def pack_b(self, w: torch.Tensor, cfg) -> np.ndarray:
        import torch
        ob, npad = cfg["ob"], self.npad(cfg)
        wp = torch.zeros(npad, self.k)
        wp[: self.n] = w
        return as_blocks(wp.reshape(npad // ob, ob, self.k).permute(0, 2, 1)).ravel()

    def pack_out(self, y: torch.Tensor, cfg) -> np.ndarray:
        import torch
        out = torch.zeros(self.m, self.npad(cfg))
        out[:, : self.n] = y.reshape(self.m, self.n)
        return as_blocks(out).ravel()

    def unpack_out(self, flat: np.ndarray, cfg) -> torch.Tensor:
        import torch
        y = torch.from_numpy(flat.reshape(self.m, self.npad(cfg))[:, : self.n].copy())
        return y.reshape(self.lead + (self.n,))

    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class MatmulContraction(Contraction):
    """Batched y[b, M, N] = x[b, M, K] @ w[b, K, N], both operands as they come (row-major):
    B's vector axis N is contiguous already, so no packing is needed at run time. An N that
    the vector block does not divide (attention scores over 197 or 1500 tokens) ends in a
    masked block: B and the output are read and written as they lie, nothing padded."""

    batch: int
    m: int
    k: int
    n: int
    lead: tuple[int, ...]

    op = "matmul"
    masks_vector = True
    spatial = ("bt", "ko", "oh")
    reduce = ("co",)

    @classmethod
    def from_compute(cls, c: Compute) -> "MatmulContraction | None":
        a, b = c.inputs[0].shape, c.inputs[1].shape
        if a[:-2] != b[:-2]:
            return None  # broadcast batches
        return cls(math.prod(a[:-2]), a[-2], a[-1], b[-1], tuple(c.output.shape))

    vector_extent = property(lambda self: self.n)
    tile_extents = property(lambda self: (self.m, 1))
    reduce_extent = property(lambda self: self.k)

    def extents(self, cfg) -> dict[str, int]:
        return {"bt": self.batch, "ko": self.n // cfg["ob"], "oh": self.m // cfg["tile_h"],
                "co": self.k // cfg["cb"]}

    def strides(self, cfg) -> dict[str, tuple[int, int, int]]:
        m, k, n, th, cb = self.m, self.k, self.n, cfg["tile_h"], cfg["cb"]
        return {"bt": (m * k, k * n, m * n), "ko": (0, cfg["ob"], cfg["ob"]),
                "oh": (th * k, 0, th * n), "ow": (0, 0, 0), "co": (cb, cb * n, 0),
                "ci": (1, n, 0)}

    def tile_strides(self, cfg):
        return ((self.k, 0), (self.n, 0))

    def buffer_sizes(self, cfg) -> dict[str, int]:
        return {"a": self.batch * self.m * self.k, "b": self.batch * self.k * self.n,
                "out": self.batch * self.m * self.n}

    def pack_a(self, x: torch.Tensor, cfg) -> np.ndarray:
        return as_blocks(x).ravel()

    pack_b = pack_a
    pack_out = pack_a

    def unpack_out(self, flat: np.ndarray, cfg) -> torch.Tensor:
        import torch
        return torch.from_numpy(flat.copy()).reshape(self.lead)

    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


def contraction(compute: Compute):
    """The contraction view of a compute, or None when it is not one we tile this way."""
    from raytune_kernels.cpu.window import WindowContraction

    if compute.op == "conv2d" and compute.inputs[0].shape[0] == 1:
        c, k, g = compute.inputs[0].shape[1], compute.output.shape[1], compute.attr("groups")
        if g > 1 and g == c == k:
            return WindowContraction.from_compute(compute)
        if (k // g) % 8 == 0:  # a group's output channels fill whole vectors
            return Conv2dContraction.from_compute(compute)
        return None
    if compute.op in ("max_pool2d", "avg_pool2d"):
        return WindowContraction.from_compute(compute)
    if compute.op == "dense":
        return DenseContraction.from_compute(compute)
    if compute.op == "matmul":
        return MatmulContraction.from_compute(compute)
    return None
