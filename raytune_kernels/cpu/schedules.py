"""One entry point per stage for every task kind: its space, its lowering, its layouts.

Tiled computes (conv2d, depthwise, pooling, dense, matmul) go through contractions; row
computes (softmax, layer norm, elementwise) through row kernels. The CUDA entry points
are in cuda/render.py; backend.py puts either set behind one Backend.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.task import Compute
from raytune_kernels.cpu.amx import (applicable as amx_applicable, amx_space, lower_amx,
                                     matmul_space, pack_amx)
from raytune_kernels.cpu.machine import CpuInfo
from raytune_kernels.cpu.contraction import contraction
from raytune_kernels.cpu.im2col import (applicable as im2col_applicable, im2col_space,
                                        lower_im2col, pack_im2col)
from raytune_kernels.cpu.loopnest import BCAST_FMA, LoopNest
from raytune_kernels.cpu.lower import (LoweringError, lower as lower_tiled, operand_kinds,
                                       pack_operands, unpack_output)
from raytune_kernels.cpu.row_kernels import (ROW_OPS, RowLoweringError, lower_rows, pack_rows,
                                             row_shape, row_space, unpack_rows)
from raytune_kernels.cpu.contraction_space import PREFETCH_B, contraction_space
from raytune_kernels.precision import DEFAULT
from raytune_kernels.space import Config, Space, UnionSpace
from raytune_kernels.cpu.winograd import (VARIANTS as WINOGRAD, applicable as winograd_applicable,
                                          lower_winograd, pack_winograd, winograd_space)

if TYPE_CHECKING:
    import torch


def unsupported_reason(compute: Compute) -> str | None:
    """None when the compute can be lowered; otherwise why not, in words."""
    if compute.op in ROW_OPS:
        try:
            row_shape(compute)
            return None
        except RowLoweringError as exc:
            return str(exc)
    if contraction(compute) is None:
        return f"no lowering for {compute.describe()}{_why(compute)}"
    try:
        operand_kinds(compute)
    except LoweringError as exc:
        return str(exc)
    return None


def _why(c: Compute) -> str:
    if c.op == "conv2d" and c.inputs[0].shape[0] != 1:
        return ": batch > 1 convolutions are not lowered yet"
    if c.op == "conv2d":
        per_group = c.output.shape[1] // c.attr("groups")
        return f": {per_group} output channels per group do not fill 8-float vectors"
    if c.op == "matmul":
        return ": broadcast batch dims, or N not a multiple of 8"
    return ""


def space_for(compute: Compute, cpu: CpuInfo, precision: str = DEFAULT
              ) -> Space | UnionSpace:
    """The schedule space of a compute on a CPU. Convolutions that im2col or Winograd
    F(2x2, 3x3) or F(4x4, 3x3) apply to get those algorithms too, under the knob
    `algorithm` (winograd, winograd4); in bf16 on a CPU with AMX, also AMX tiles (amx)."""
    reason = unsupported_reason(compute)
    if reason:
        raise LoweringError(reason)
    if compute.op in ROW_OPS:
        return row_space(compute, cpu.lanes)
    direct = contraction_space(contraction(compute), cpu)
    parts = [("direct", direct)]
    if im2col_applicable(compute):
        parts.append(("im2col", im2col_space(compute, cpu)))
    for name, variant in WINOGRAD.items():
        if winograd_applicable(compute, variant):
            parts.append((name, winograd_space(compute, cpu, variant)))
    if amx_applicable(compute, cpu, precision):
        parts.append(("amx", matmul_space(compute) if compute.op == "matmul"
                      else amx_space(compute, cpu)))
    return UnionSpace("algorithm", tuple(parts)) if len(parts) > 1 else direct


def no_kernel_reason(compute: Compute, cpu: CpuInfo, precision: str = DEFAULT
                     ) -> str | None:
    """Why no kernel of ours can run a compute on this CPU (None when one can): no
    lowering for its shape, or a schedule space that comes out empty here (no register
    tile fits the CPU's vector widths, say). The tuner skips such a task and the compiled
    network runs PyTorch's kernel for it, each with a warning."""
    why = unsupported_reason(compute)
    if why:
        return why
    try:
        space = space_for(compute, cpu, precision)
        if not space.count():
            return f"its schedule space is empty on {cpu.name}"
        lower(compute, space.sample(random.Random(0)))  # what the space cannot see
    except ValueError as exc:  # LoweringError and RowLoweringError
        return str(exc)
    return None


def writes_bordered(compute: Compute, cfg: Config) -> bool:
    """Whether this kernel can write its output into a bordered buffer (knob out_pad): a
    direct, Winograd or AMX conv, depthwise conv or pool (their output strides and offset
    follow the border; a residual they read has its own, res_pad)."""
    if compute.op in ROW_OPS or \
            cfg.get("algorithm", "direct") not in ("direct", *WINOGRAD, "amx"):
        return False
    return hasattr(contraction(compute), "out_layout")


def reads_bordered_input(compute: Compute, cfg: Config) -> bool:
    """Whether this kernel can read its input inside a border it does not need (knob
    in_pad): a direct conv of no padding (a 1x1 conv), whose strides then follow the
    buffer's border."""
    if compute.op != "conv2d" or cfg.get("algorithm", "direct") != "direct":
        return False
    con = contraction(compute)
    return hasattr(con, "in_offset") and con.pad == (0, 0)


def nhwc_reader(compute: Compute, cfg: Config) -> Config | None:
    """`cfg` reading its input NHWC in its channel blocks (knob in_layout, a direct
    ungrouped conv whose blocks cb do not already span the channels: cb = C reads NHWC
    as it is); else None. The same loops, weights and sums in the same order: the outputs
    are those of `cfg` bit for bit, and no copy need bring an NHWC input into NCHW[cb]c."""
    if compute.op != "conv2d" or cfg.get("algorithm", "direct") != "direct" or \
            cfg.get("in_layout", "blocked") != "blocked":
        return None
    con = contraction(compute)
    if not hasattr(con, "reads_nhwc") or con.groups != 1 or cfg["cb"] == con.c:
        return None
    return Config(tuple(sorted(cfg.knobs + (("in_layout", "nhwc"),))))


def prefetch_twin(compute: Compute, cfg: Config) -> Config | None:
    """`cfg` with its knob prefetch_b turned the other way (a config from before the knob
    counts as 0), for a direct outer-product kernel that has the knob; else None. The
    twin reads and writes the same layouts and computes the same values bit for bit."""
    if compute.op in ROW_OPS or cfg.get("algorithm", "direct") != "direct":
        return None
    con = contraction(compute)
    if not (con.has_b and con.mode == BCAST_FMA):
        return None
    knobs = {**dict(cfg.knobs), "prefetch_b": PREFETCH_B[1] if not cfg.get("prefetch_b")
             else PREFETCH_B[0]}
    return Config(tuple(sorted(knobs.items())))


IMAGE_OPS = ("conv2d", "max_pool2d", "avg_pool2d")  # kernels over an image's rows


def rows_first_twin(compute: Compute, cfg: Config, threads: int,
                    row_axes: tuple[str, ...] = ("oh", "pt")) -> Config | None:
    """`cfg` with its outer loops reordered so that its threads split rows (the first of
    `row_axes` its spatial_order holds) before the loops that came first, their order kept
    otherwise: (ko, oh, ow) -> (oh, ko, ow). The same tile, layouts and values bit for bit
    (each output element's sum is the same); only which thread writes what changes. None
    where the kernel is not a direct or window one, already splits rows first, has no
    rows to split, or would split them among fewer parallel iterations than `threads`
    (denses and matmuls, whose rows are a batch's tokens, are left as they are)."""
    order = cfg.get("spatial_order")
    if compute.op not in IMAGE_OPS or cfg.get("algorithm", "direct") != "direct" or \
            not order:
        return None
    rows = next((a for a in order if a in row_axes), None)
    if rows is None or order[0] == rows:
        return None
    knobs = {**dict(cfg.knobs), "spatial_order": (rows, *(a for a in order if a != rows))}
    twin = Config(tuple(sorted(knobs.items())))
    try:
        outer = lower(compute, twin).body[0]
    except LoweringError:
        return None
    split = outer.body[0] if getattr(outer, "kind", None) == "parallel" else None
    if split is None or split.names[0] not in row_axes or outer.extent < threads:
        return None  # rows of one tile drop out of the loops: the split stays as it was
    return twin


def reads_bordered_residual(compute: Compute, cfg: Config) -> bool:
    """Whether this kernel reads a residual (an epilogue tensor laid out like its output)
    and can read it from a bordered buffer (knob res_pad): the kernels that can write one."""
    return writes_bordered(compute, cfg) and \
        any(k.kind == "output" for k in operand_kinds(compute))


def lower(compute: Compute, cfg: Config) -> LoopNest:
    knobs = dict(cfg.knobs)
    if "out_pad" in knobs and not writes_bordered(compute, cfg):
        raise LoweringError(f"{compute.describe()}: config {cfg.to_json()} cannot write a "
                            f"bordered output (out_pad): a direct, Winograd or AMX conv or a "
                            f"window can")
    if "res_pad" in knobs and not reads_bordered_residual(compute, cfg):
        raise LoweringError(f"{compute.describe()}: config {cfg.to_json()} cannot read a "
                            f"bordered residual (res_pad): a direct, Winograd or AMX conv or "
                            f"a window with a residual operand can")
    if "in_pad" in knobs and not reads_bordered_input(compute, cfg):
        raise LoweringError(f"{compute.describe()}: config {cfg.to_json()} cannot read its "
                            f"input inside a border (in_pad): a direct conv of no padding "
                            f"can")
    if "in_layout" in knobs and cfg.get("algorithm", "direct") != "direct":
        raise LoweringError(f"{compute.describe()}: config {cfg.to_json()} cannot read its "
                            f"input NHWC in channel blocks (in_layout): a direct conv can")
    if compute.op in ROW_OPS:
        return lower_rows(compute, cfg)
    if cfg.get("algorithm") == "im2col":
        return lower_im2col(compute, cfg)
    if cfg.get("algorithm") == "amx":
        return lower_amx(compute, cfg)
    if cfg.get("algorithm") in WINOGRAD:
        return lower_winograd(compute, cfg)
    return lower_tiled(compute, cfg)


def pack(compute: Compute, cfg: Config, operands) -> dict[str, np.ndarray]:
    if compute.op in ROW_OPS:
        return pack_rows(compute, cfg, operands)
    if cfg.get("algorithm") == "im2col":
        return pack_im2col(compute, cfg, operands)
    if cfg.get("algorithm") == "amx":
        return pack_amx(compute, cfg, operands)
    if cfg.get("algorithm") in WINOGRAD:
        return pack_winograd(compute, cfg, operands)
    return pack_operands(compute, cfg, operands)


def unpack(compute: Compute, cfg: Config, flat: np.ndarray) -> torch.Tensor:
    if compute.op in ROW_OPS:
        return unpack_rows(compute, cfg, flat)
    return unpack_output(compute, cfg, flat)
