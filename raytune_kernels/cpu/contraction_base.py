"""What every tiled contraction shares (the base of contraction.py's convs, dense and
matmul and of window.py's depthwise convs and pools), on its own so that both modules
build on it without importing each other."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.cpu.loopnest import BCAST_FMA
from raytune_kernels.cpu.transform import Layout
from raytune_kernels.space import Config

if TYPE_CHECKING:
    import torch


class Contraction:
    """Defaults shared by every contraction; each subclass states how it differs."""

    mode = BCAST_FMA  # how A and B update the accumulator tile
    has_b = True  # a second operand (weights) is read
    init = 0.0  # accumulator initial value
    blocked_reduce = True  # the reduction has a channel block `cb`, unrolled innermost
    pads_vector = False  # the vector axis is padded up to the block instead of divided
    masks_vector = False  # the vector axis ends in a masked block where the block does
    # not divide it (lower._vector_runs)
    unrollable: str | None = None

    out_layouts: tuple[str, ...] = ()  # output layouts beyond the default, as a knob

    def pre_epilogue(self) -> tuple:
        return ()

    def out_offset(self, cfg) -> int:
        """Where the output's first element lies in its buffer: past a border (out_pad)."""
        return 0

    def channel_len(self, cfg) -> int:
        return self.vector_extent


def out_pad(cfg) -> tuple[int, int]:
    """The border (rows, columns) around the output that a kernel writes into its
    consumer's bordered buffer, so that no copy adds it: a knob compile_network sets on a
    direct conv or window whose only reader wants that border, never one the search
    tunes (the kernel does the same work; only its output strides and offset change)."""
    return tuple(cfg.get("out_pad", (0, 0)))


def res_pad(cfg) -> tuple[int, int]:
    """The border (rows, columns) of the buffer a residual operand (an epilogue tensor laid
    out like the output) is read from: a knob compile_network sets where that value lives
    in the bordered buffer its other reader wants, never one the search tunes (the kernel
    reads the interior, where it would read an unbordered copy)."""
    return tuple(cfg.get("res_pad", (0, 0)))


def residual_cfg(cfg):
    """`cfg` as its residual operands are laid out: the output's layout, with res_pad for
    its border (the output's own border, out_pad, is no residual's)."""
    knobs = tuple(kv for kv in cfg.knobs if kv[0] not in ("out_pad", "res_pad"))
    pad = res_pad(cfg)
    return Config(tuple(sorted(knobs + ((("out_pad", pad),) if pad != (0, 0) else ()))))


def written_layout(cfg) -> Layout:
    """The layout a direct or Winograd conv or a window writes (knob out_layout: NCHW[ob]c
    or NHWC), its border (out_pad) included."""
    nhwc = cfg.get("out_layout", "blocked") == "nhwc"
    return Layout("NHWC" if nhwc else f"NCHW{cfg['ob']}c", out_pad(cfg))


def as_blocks(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """A packed operand as a contiguous float32 array."""
    import torch
    return np.ascontiguousarray(x.detach().numpy() if isinstance(x, torch.Tensor) else x,
                                dtype=np.float32)
