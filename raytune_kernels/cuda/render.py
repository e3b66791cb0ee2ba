"""compute + cuda config -> CudaKernel (source, launch geometry, buffers): one entry point
per stage for every task kind on target "cuda".

Families: conv2d (any stride, padding, dilation, groups), dense and matmul are tiled GEMMs
(cuda/gemm.py, FFMA in float32; with a precision other than fp32 also tensor-core GEMMs,
cuda/mma.py, under the knob `kernel`: "ffma" or "mma"); depthwise conv and pooling are sliding windows (cuda_window); softmax and
layer norm are row reductions and elementwise tasks a flat map (cuda_rows). Convolutions
and windows on 4-D activations have a knob `layout`: NCHW (torch's contiguous layout) or
NHWC; everything else reads and writes torch's contiguous layouts. cuda_pack / cuda_unpack
(cuda_kernel) are the host side of every kernel. Rendering is a pure function of
(compute, config).
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from raytune_kernels.task import Compute
from raytune_kernels.cuda.epilogue import CudaLoweringError, epilogue_reason, is_full, operand_specs
from raytune_kernels.cuda.gemm import gemm_space, render_gemm
from raytune_kernels.cuda.gemm_views import Strides, gemm_view
from raytune_kernels.cuda.kernel import CudaKernel, buffers_of
from raytune_kernels.cuda import split_k
from raytune_kernels.cuda.mma import MMA_PRECISIONS, mma_space, render_mma
from raytune_kernels.precision import DEFAULT, PRECISIONS
from raytune_kernels.cuda.row_kernels import (ROW_OPS, Rows, elementwise_space,
                                              render_elementwise, render_rows, row_reason,
                                              row_space)
from raytune_kernels.cuda.window import (LAYOUTS, Window, is_window, render_window, window_reason,
                                         window_space)
from raytune_kernels.space import Config, Space, UnionSpace, completed

if TYPE_CHECKING:
    import torch

__all__ = ["CudaKernel", "CudaLoweringError", "cuda_layouts", "cuda_pack", "cuda_space_for",
           "cuda_unpack", "operand_layouts", "render_cuda", "cuda_unsupported_reason"]

GEMM_OPS = ("conv2d", "dense", "matmul")


@functools.lru_cache(maxsize=512)
def cuda_unsupported_reason(compute: Compute) -> str | None:
    """None when the compute renders to CUDA; otherwise why not, in words."""
    bad = [s.dtype for s in (*compute.inputs, compute.output) if s.dtype != "float32"]
    if bad:
        return f"{compute.describe()}: dtype {bad[0]} (the CUDA kernels are float32 only)"
    try:
        reason = _anchor_reason(compute) or epilogue_reason(compute)
        if reason is None:
            buffers_of(compute)
            _space(compute)
    except (CudaLoweringError, ValueError) as exc:
        reason = str(exc)
    return None if reason is None else f"{compute.describe()}: {reason}"


def _anchor_reason(c: Compute) -> str | None:
    if c.op in ROW_OPS:
        return row_reason(c)
    if c.op == "elementwise":
        return None if len(c.inputs) == 1 else "elementwise task with several inputs"
    if is_window(c):
        return window_reason(c)
    if c.op in GEMM_OPS:
        if c.op == "conv2d" and len(c.inputs[0].shape) != 4:
            return "conv2d on a non-4-D input"
        gemm_view(c)  # raises with a reason for shapes it cannot view
        return None
    return f"no CUDA kernel for op '{c.op}'"


def cuda_space_for(compute: Compute, precision: str = DEFAULT) -> Space | UnionSpace:
    """The GPU schedule space of a compute in `precision` (raises CudaLoweringError when
    unsupported). In fp32 it holds the FFMA kernels alone; in tf32, fp16 or bf16 a GEMM's
    space is the union of its FFMA kernels and its tensor-core kernels under the knob
    `kernel`, every config carrying `precision`; other families are the same in every
    precision (they compute in float32)."""
    if precision not in PRECISIONS:
        raise CudaLoweringError(f"unknown precision {precision!r}: expected one of "
                                f"{PRECISIONS}")
    reason = cuda_unsupported_reason(compute)
    if reason:
        raise CudaLoweringError(reason)
    if precision in MMA_PRECISIONS and compute.op in GEMM_OPS and not is_window(compute):
        return _mixed_space(compute, precision)
    return _space(compute)


def config_precision(cfg: Config) -> str:
    """The precision a config computes in (fp32 unless it names another)."""
    return cfg.get("precision", DEFAULT)


@functools.lru_cache(maxsize=512)
def _mixed_space(compute: Compute, precision: str) -> UnionSpace:
    """FFMA and tensor-core GEMMs of one precision; a convolution's layout is a coupled
    knob of each part (each layout has its own GEMM view, so its own tilings)."""
    layouts = LAYOUTS if compute.op == "conv2d" else (None,)
    return _union_of([(lay, gemm_view(compute, lay or "NCHW")) for lay in layouts], precision)


def _union_of(views: list, precision: str) -> UnionSpace:
    """The FFMA and tensor-core spaces of these (layout or None, GEMM view) pairs."""
    ffma = [(lay, gemm_space(view)) for lay, view in views]
    mma = []
    for lay, view in views:
        try:
            mma.append((lay, mma_space(view, precision)))
        except ValueError:
            continue
    tag = (("precision", (precision,)),)
    parts = [("ffma", _with_layouts(ffma, tag))]
    if mma:
        parts.append(("mma", _with_layouts(mma, ())))
    return UnionSpace("kernel", tuple(parts))


def _with_layouts(parts: list[tuple[str | None, Space]], extra: tuple) -> Space:
    """One space from a space per layout (the layout a coupled knob), or the only space
    (layout None); `extra` independent knobs added."""
    first = parts[0][1]
    if parts[0][0] is None:
        return Space(first.coupled_names, first.coupled, first.independent + extra)
    combos = tuple((lay,) + c for lay, sp in parts for c in sp.coupled)
    return Space(("layout",) + first.coupled_names, combos, first.independent + extra)


@functools.lru_cache(maxsize=512)
def _space(compute: Compute) -> Space | UnionSpace:
    """Built once per compute: enumerating a GEMM space takes tens of milliseconds, and
    every render and every cost-model feature row checks its config against the space
    (rebuilt per candidate, it held a GPU's tuning run under one trial a second)."""
    if compute.op in ROW_OPS:
        return row_space(Rows.from_compute(compute))
    if compute.op == "elementwise":
        return elementwise_space(compute)
    if is_window(compute):
        return window_space(Window.from_compute(compute))
    if compute.op == "conv2d":
        return UnionSpace("layout", tuple((lay, gemm_space(gemm_view(compute, lay)))
                                          for lay in LAYOUTS))
    return gemm_space(gemm_view(compute))


def default_config(compute: Compute, precision: str = DEFAULT,
                   sms: int | None = None) -> Config:
    """The config an untuned task runs on a GPU: a middle-of-the-road point of its space,
    chosen by rule, not measured. Every point of a space obeys the space's limits
    (registers, threads, vector alignment), so any is safe. In a precision with tensor
    cores, on a GPU of `sms` SMs, a GEMM runs fill_seed's small blocks that cover them.
    Otherwise this prefers 256 threads per block (128 for windows), 64x64 GEMM blocks of
    4x4 per thread, K slices of 16, the widest vector loads, no prefetch, an unroll of 4,
    no split-K, and NCHW; without `sms`, a tensor-core GEMM takes 4 warps of 32x32, K
    slices of 32, 3 stages, 16-byte copies, no split-K, NCHW. Tuning replaces it."""
    if sms is not None:
        fill = fill_seed(compute, precision, sms)
        if fill is not None:
            return fill
    space = cuda_space_for(compute, precision)
    if isinstance(space, UnionSpace) and space.key == "kernel":
        name, part = space.parts[-1]
        best = min(part, key=_default_penalty)
        return Config(tuple(sorted(best.knobs + ((space.key, name),))))
    if isinstance(space, UnionSpace):  # GEMM convolutions: one space per layout
        label, part = next((p for p in space.parts if p[0] == "NCHW"), space.parts[0])
        best = min(part, key=_default_penalty)
        return Config(tuple(sorted(best.knobs + ((space.key, label),))))
    return min(space, key=_default_penalty)


def split_seed(compute: Compute, cfg: Config, sms: int) -> Config | None:
    """An unsplit GEMM config (the untuned default) with its reduction split so that its
    grid covers `sms` SMs (or split as far as the space allows), where its own grid leaves
    more than half of them idle; None otherwise, and for anything but a GEMM. A rule, not
    a measurement: a search measures it beside the default (Backend.seeds), so that a task
    given one or two trials already gets split-K where a batch-1 layer needs it."""
    if cfg.get("split") is None:
        return None
    view = gemm_view(compute, cfg.get("layout", "NCHW"))
    bm, bn = block_tile(cfg)
    tiles = split_k.tiles(view, bm, bn)
    factors = [f for f in split_k.splits(view, bm, bn, cfg["bk"]) if f > 1]
    if 2 * tiles > sms or not factors:
        return None
    split = next((f for f in factors if tiles * f >= sms), factors[-1])
    return Config(tuple(sorted({**dict(cfg.knobs), "split": split}.items())))


# the block tile a fill seed aims at, in outputs: in the GPU records of bench/results/,
# tensor-core blocks of 32x32 or 64x16, split until the grid covered the SMs, ran ResNet-18's
# small-grid layers 1.8-5.3x faster than one 32x128 block of 4 warps
FILL_TILE = 1024


@functools.lru_cache(maxsize=1024)
def fill_seed(compute: Compute, precision: str, sms: int,
              layout: str = "NHWC") -> Config | None:
    """The tensor-core config of small blocks that fills `sms` SMs: a block tile of about
    FILL_TILE outputs from 4 warps, 3 stages of 32-deep slices, the widest copies, a
    convolution in `layout`, and the smallest split whose grid covers every SM (the
    largest the space has, where none does); a convolution whose tensor-core space lacks
    `layout` takes the layout it has. None where the task has no tensor-core GEMM
    (fp32, or not a GEMM). A rule, not a measurement: what an untuned GEMM runs with
    tensor cores (default_config) and what a search measures first (Backend.seeds).
    Cached: it walks the whole tensor-core space."""
    space = cuda_space_for(compute, precision)
    if not (isinstance(space, UnionSpace) and space.key == "kernel"):
        return None
    part = dict(space.parts).get("mma")
    if part is None:
        return None
    names = part.coupled_names
    combos = part.coupled
    if "layout" in names:  # `layout` where the space has it
        at = names.index("layout")
        have = {c[at] for c in combos}
        layout = layout if layout in have else min(have)
        combos = [c for c in combos if c[at] == layout]
    view = gemm_view(compute, layout)
    log2 = math.log2

    def penalty(combo: tuple) -> float:
        d = dict(zip(names, combo))
        bm, bn = d["wm"] * d["warps_m"], d["wn"] * d["warps_n"]
        blocks = split_k.tiles(view, bm, bn) * d["split"]
        p = abs(log2(bm * bn / FILL_TILE)) + abs(log2(d["warps_m"] * d["warps_n"] / 4))
        p += 0.5 * abs(log2(d["bk"] / 32)) + 0.3 * (3 - d["stages"])
        p -= 0.25 * log2(d["va"] * d["vb"])
        return p + 4 * max(0.0, log2(sms / blocks)) + 0.25 * log2(d["split"])
    knobs = dict(zip(names, min(combos, key=penalty)))
    knobs.update({name: values[0] for name, values in part.independent})  # the precision
    return Config(tuple(sorted({**knobs, space.key: "mma"}.items())))


def _default_penalty(cfg: Config) -> float:
    d, log2 = dict(cfg.knobs), np.log2
    if d.get("split", 1) > 1:  # split-K pays only where the grid is small: tuning decides
        return np.inf
    if "wm" in d:  # a tensor-core GEMM
        p = abs(log2(d["wm"] / 32)) + abs(log2(d["wn"] / 32))
        p += abs(log2(d["warps_m"] * d["warps_n"] / 4)) + 0.5 * abs(log2(d["bk"] / 32))
        p += 0.3 * (3 - d["stages"]) - 0.25 * log2(d["va"] * d["vb"])
        return float(p + 0.01 * (d.get("layout", "NCHW") != "NCHW"))
    if "bm" in d:  # a GEMM tile
        threads = (d["bm"] // d["tm"]) * (d["bn"] // d["tn"])
        p = abs(log2(threads / 256)) + abs(log2(d["bm"] * d["bn"] / 4096))
        p += abs(log2(d["tm"] * d["tn"] / 16)) + 0.5 * abs(log2(d["bk"] / 16))
        p += 0.5 * d["prefetch"] + 0.1 * d["interleave"] - 0.25 * log2(d["va"] * d["vb"])
        return float(p + 0.2 * (d["unroll"] != 4))
    target = 128 if "tw" in d else 256
    p = abs(log2(d["threads"] / target)) - 0.25 * log2(d.get("vec", 1))
    p += 0.1 * log2(d.get("items", 1)) + 0.3 * abs(log2(d.get("tw", 2) / 2))
    p += 0.2 * (d.get("unroll") is False) + 0.01 * (d.get("layout", "NCHW") != "NCHW")
    return float(p)


def cuda_layouts(compute: Compute, cfg: Config) -> tuple[str, str]:
    """(data input's layout, output's layout) of a config's kernel. Epilogue operands of
    the output's shape (residuals) are read in the output's layout, every other operand
    (weights as the planner packs them, biases, broadcasts) in torch's."""
    lay = cfg.get("layout", "NCHW")
    return lay, lay


@functools.lru_cache(maxsize=256)
def strided_space(compute: Compute, precision: str, strides: Strides) -> Space | UnionSpace:
    """The space of a matmul whose operands or output lie at `strides` (gemm_views.
    StridedMatmulGemm): the tilings of that view, which differ from the contiguous
    matmul's where an operand's contiguous axis does (a transposed key)."""
    view = gemm_view(compute, "NCHW", strides)
    if precision in MMA_PRECISIONS:
        return _union_of([(None, view)], precision)
    return gemm_space(view)


def strided_problem(compute: Compute, cfg: Config, strides: Strides) -> str | None:
    """None when a config of the contiguous matmul renders at `strides` too; else why not
    (a network then copies the operand into place, as it would without strides)."""
    try:
        space = strided_space(compute, config_precision(cfg), tuple(strides))
    except (CudaLoweringError, ValueError) as exc:
        return str(exc)
    cfg = completed(cfg, space)
    return union_problem(space, cfg) if isinstance(space, UnionSpace) else \
        config_problem(space, cfg)


def render_cuda(compute: Compute, cfg: Config, strides: Strides | None = None,
                rounded: bool = False) -> CudaKernel:
    """CUDA C and launch geometry of one config; a config outside the compute's space
    raises CudaLoweringError naming the knobs that are wrong. `strides`: a matmul reading
    or writing permuted views in place (strided_problem says whether cfg renders so).
    `rounded`: a tf32 tensor-core GEMM whose weight operand (in1) holds tf32 values
    already (rounded at packing: cuda_plan.tf32), read with no conversion (rounds_weights)."""
    if rounded and not rounds_weights(compute, cfg):
        raise CudaLoweringError(f"rounded weights for a config that converts no weight "
                                f"(tf32 tensor-core GEMMs only): {compute.describe()}")
    space = cuda_space_for(compute, config_precision(cfg)) if strides is None else \
        strided_space(compute, config_precision(cfg), tuple(strides))
    cfg = completed(cfg, space)  # a record written before a knob joined the space
    problem = union_problem(space, cfg) if isinstance(space, UnionSpace) else \
        config_problem(space, cfg)
    if problem:
        raise CudaLoweringError(f"bad cuda config for {compute.describe()}: {problem}")
    if strides is not None:
        view = gemm_view(compute, "NCHW", tuple(strides))
        return render_mma(compute, view, cfg, rounded) if cfg.get("kernel") == "mma" else \
            render_gemm(compute, view, cfg)
    if compute.op in ROW_OPS:
        return render_rows(compute, Rows.from_compute(compute), cfg)
    if compute.op == "elementwise":
        return render_elementwise(compute, cfg)
    if is_window(compute):
        return render_window(compute, Window.from_compute(compute), cfg)
    view = gemm_view(compute, cfg.get("layout", "NCHW"))
    if cfg.get("kernel") == "mma":
        return render_mma(compute, view, cfg, rounded)
    return render_gemm(compute, view, cfg)


def rounds_weights(compute: Compute, cfg: Config) -> bool:
    """Whether a config's kernel converts its weight operand (in1) to tf32 at every
    fragment read, which a network can do once instead, at packing (render_cuda's
    `rounded`): a tf32 tensor-core GEMM."""
    return compute.op in GEMM_OPS and cfg.get("kernel") == "mma" and \
        config_precision(cfg) == "tf32" and not is_window(compute)


def union_problem(space: UnionSpace, cfg: Config) -> str | None:
    """config_problem for a space with alternatives under space.key."""
    parts = dict(space.parts)
    if cfg.get(space.key) not in parts:
        return f"{space.key}={cfg.get(space.key)!r} is not one of {tuple(parts)}"
    return config_problem(parts[cfg[space.key]],
                          Config(tuple(kv for kv in cfg.knobs if kv[0] != space.key)))


def config_problem(space: Space, cfg: Config) -> str | None:
    """None when cfg is a point of space; else what is wrong with it, in words."""
    have = dict(cfg.knobs)
    names = set(space.coupled_names) | {n for n, _ in space.independent}
    missing, extra = sorted(names - set(have)), sorted(set(have) - names)
    if missing or extra:
        return f"missing knobs {missing}, unknown knobs {extra}"
    for name, choices in space.independent:
        if have[name] not in choices:
            return f"{name}={have[name]!r} is not one of {choices}"
    combo = tuple(have[n] for n in space.coupled_names)
    if combo not in space.coupled:
        pairs = ", ".join(f"{n}={v!r}" for n, v in zip(space.coupled_names, combo))
        return f"({pairs}) is not a valid combination of these knobs"
    return None


# ------------------------------------------------------------------ the host side of buffers

def operand_layouts(compute: Compute, cfg: Config) -> list[str]:
    """The layout of each input buffer, in reference operand order: "NCHW" (torch's
    contiguous layout, whatever the rank) or "NHWC" (the 4-D tensor permuted to N, H, W,
    C). An NHWC config reads its data input and its output-shaped epilogue operands
    (residuals) in NHWC, and a GEMM conv's weight [K][C/g][kh][kw] permuted the same way
    ([K][kh][kw][C/g]); biases, depthwise weights and broadcasts stay as torch holds them."""
    lay = cuda_layouts(compute, cfg)[0]
    out = []
    for i, _ in enumerate(compute.inputs):
        gemm_weight = i == 1 and compute.op == "conv2d" and not is_window(compute)
        out.append(lay if i == 0 or gemm_weight else "NCHW")
    for op, spec in operand_specs(compute):
        out.append(lay if is_full(op, spec, compute.output.shape) else "NCHW")
    return out


def to_buffer_layout(x: torch.Tensor, layout: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A torch tensor of logical `shape` as a contiguous tensor in `layout`."""
    x = x.reshape(shape)
    return x.permute(0, 2, 3, 1).contiguous() if layout == "NHWC" else x.contiguous()


def scratch_sizes(compute: Compute, cfg: Config) -> list[int]:
    """Floats of each scratch buffer a config's kernel takes (between its operands and
    out, zeroed once: kernel.py): a split-K GEMM's partial sums and tile counters; none
    for any other kernel."""
    split = split_k.config_split(cfg)
    if split == 1:
        return []
    view = gemm_view(compute, cfg.get("layout", "NCHW"))
    return [size for _, size in split_k.scratch(view, *block_tile(cfg), split)]


def block_tile(cfg: Config) -> tuple[int, int]:
    """(bm, bn): the output tile of one block of a GEMM config, FFMA or tensor-core."""
    if cfg.get("kernel") == "mma":
        return cfg["wm"] * cfg["warps_m"], cfg["wn"] * cfg["warps_n"]
    return cfg["bm"], cfg["bn"]


def cuda_pack(compute: Compute, operands, cfg: Config) -> list[np.ndarray]:
    """Reference-order torch operands -> flat float32 arrays in buffer order and in the
    config's layouts (scratch and out zeroed)."""
    specs = list(compute.inputs) + [s for _, s in operand_specs(compute)]
    if len(operands) != len(specs):
        raise ValueError(f"{compute.describe()} takes {len(specs)} operands, "
                         f"got {len(operands)}")
    flat = []
    layouts = operand_layouts(compute, cfg)
    for i, (x, spec, lay) in enumerate(zip(operands, specs, layouts)):
        if tuple(x.shape) != tuple(spec.shape):
            raise ValueError(f"operand {i} of {compute.describe()} has shape "
                             f"{tuple(x.shape)}, expected {spec.shape}")
        shape = compute.output.shape if i >= len(compute.inputs) and lay == "NHWC" \
            else spec.shape
        t = to_buffer_layout(x.detach().cpu().float(), lay, shape)
        flat.append(np.ascontiguousarray(t.numpy(), np.float32).ravel())
    flat += [np.zeros(n, np.float32) for n in scratch_sizes(compute, cfg)]
    flat.append(np.zeros(compute.output.numel, np.float32))
    return flat


def cuda_unpack(compute: Compute, flat, cfg: Config) -> torch.Tensor:
    """The output buffer (numpy array or CPU/GPU torch tensor) in the reference's shape."""
    import torch
    t = flat if isinstance(flat, torch.Tensor) else torch.from_numpy(np.asarray(flat).copy())
    shape = compute.output.shape
    if t.numel() != compute.output.numel:
        raise ValueError(f"output of {t.numel()} elements for {shape}")
    if cuda_layouts(compute, cfg)[1] == "NHWC":
        n, c, h, w = shape
        return t.reshape(n, h, w, c).permute(0, 3, 1, 2)
    return t.reshape(shape)
