"""Sliding-window kernels in CUDA C: depthwise conv (one input channel per group, any
channel multiplier), max / average pooling and adaptive average pooling.

One thread computes `tw` neighbouring outputs of a row (a register tile: each input row
it reads serves every one of them), threads are numbered along the output row so a warp's
loads are neighbouring addresses, and a 1-D grid covers (image, channel, row, column
group). Taps outside the input are skipped: zero padding for conv and sums, -inf for max.
Average pooling divides by torch's own count (padding included or not, ceil-mode windows
clipped). Knobs: threads per block, `tw`, whether the loop over kw is unrolled, and the
activations' layout: NCHW, or NHWC where threads are numbered along channels instead (a
warp reads 32 neighbouring channels of one pixel, contiguous in NHWC). The depthwise
weight keeps torch's [K][1][kh][kw] in both (it is small and stays in cache).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from raytune_kernels.task import Compute
from raytune_kernels.cuda.epilogue import epilogue_lines, flit, operand_reads
from raytune_kernels.cuda.kernel import (CudaKernel, buffers_of, check_grid, kernel_name,
                                         kernel_source)
from raytune_kernels.space import Config, Space

WINDOW_OPS = ("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")


@dataclass(frozen=True)
class Window:
    kind: str  # "depthwise", "max", "avg" or "adaptive"
    nb: int
    c: int  # input channels
    h: int
    w: int
    k: int  # output channels
    oh: int
    ow: int
    kh: int = 1
    kw: int = 1
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    dil: tuple[int, int] = (1, 1)
    count_pad: bool = True

    @classmethod
    def from_compute(cls, c: Compute) -> "Window":
        nb, ch, h, w = c.inputs[0].shape
        _, k, oh, ow = c.output.shape
        shape = (nb, ch, h, w, k, oh, ow)
        if c.op == "conv2d":
            kh, kw = c.inputs[1].shape[2:]
            return cls("depthwise", *shape, kh, kw, tuple(c.attr("stride")),
                       tuple(c.attr("padding")), tuple(c.attr("dilation")))
        if c.op == "adaptive_avg_pool2d":
            return cls("adaptive", *shape)
        kh, kw = c.attr("kernel")
        if c.op == "max_pool2d":
            return cls("max", *shape, kh, kw, tuple(c.attr("stride")),
                       tuple(c.attr("padding")), tuple(c.attr("dilation", (1, 1))))
        return cls("avg", *shape, kh, kw, tuple(c.attr("stride")), tuple(c.attr("padding")),
                   count_pad=bool(c.attr("count_include_pad")))

    def work(self, tw: int) -> int:
        return self.nb * self.k * self.oh * math.ceil(self.ow / tw)


def is_window(c: Compute) -> bool:
    """Pools, and convs whose groups each read one input channel (depthwise)."""
    if c.op in WINDOW_OPS:
        return True
    return c.op == "conv2d" and c.inputs[0].shape[1] == c.attr("groups")


def window_space(win: Window) -> Space:
    tws = tuple(t for t in (1, 2, 4, 8) if t <= win.ow)
    unroll = (False, True) if win.kind != "adaptive" and win.kw > 1 else (False,)
    return Space(("threads", "tw"), tuple((t, tw) for t in (64, 128, 256, 512) for tw in tws),
                 (("unroll", unroll), ("layout", LAYOUTS)))


LAYOUTS = ("NCHW", "NHWC")


def _strides(win: Window, layout: str) -> tuple[int, int]:
    """(elements between neighbouring pixels of a channel, between rows) of the input."""
    return (1, win.w) if layout == "NCHW" else (win.c, win.w * win.c)


def _taps(win: Window, cfg: Config) -> list[str]:
    """Loops over the window, updating acc[t] for each of the thread's tw outputs."""
    (sh, sw), (ph, pw), (dh, dw) = win.stride, win.pad, win.dil
    tw = cfg["tw"]
    cs, rs = _strides(win, cfg["layout"])
    x = "xr[iw]" if cs == 1 else f"xr[iw * {cs}]"
    update = {"depthwise": f"acc[t] = fmaf({x}, wv, acc[t]);",
              "max": f"acc[t] = fmaxf(acc[t], {x});"}.get(win.kind, f"acc[t] += {x};")
    lines = [f"for (int kh = 0; kh < {win.kh}; ++kh) {{",
             f"const int ih = oh * {sh} - {ph} + kh * {dh};",
             f"if ((unsigned)ih >= {win.h}u) continue;",
             f"const float* xr = xp + ih * {rs};",
             "#pragma unroll" if cfg["unroll"] else "#pragma unroll 1",
             f"for (int kw = 0; kw < {win.kw}; ++kw) {{"]
    if win.kind == "depthwise":
        lines.append(f"const float wv = in1[(ch * {win.kh} + kh) * {win.kw} + kw];")
    lines += ["#pragma unroll", f"for (int t = 0; t < {tw}; ++t) {{",
              f"const int iw = (ow0 + t) * {sw} - {pw} + kw * {dw};",
              f"if ((unsigned)iw < {win.w}u) {update}", "}", "}", "}"]
    return lines


def _avg_divisor(win: Window) -> list[str]:
    """torch's avg_pool2d divisor for output (oh, ow): the window clipped to the padded
    input when padding counts, else the number of real input taps."""
    (sh, sw), (ph, pw), (kh, kw) = win.stride, win.pad, (win.kh, win.kw)
    lines = [f"const int hs = oh * {sh} - {ph}, ws = ow * {sw} - {pw};",
             f"const int he = min(hs + {kh}, {win.h + ph}), we = min(ws + {kw}, {win.w + pw});"]
    if win.count_pad:
        return lines + ["const float div = (float)((he - hs) * (we - ws));"]
    return lines + [f"const float div = (float)((min(he, {win.h}) - max(hs, 0)) * "
                    f"(min(we, {win.w}) - max(ws, 0)));"]


def _adaptive(win: Window, layout: str) -> list[str]:
    """Adaptive average pooling: torch's start = floor(o * in / out), end = ceil."""
    return [f"const int hs = oh * {win.h} / {win.oh}, "
            f"he = ((oh + 1) * {win.h} + {win.oh - 1}) / {win.oh};",
            f"const int ws = ow * {win.w} / {win.ow}, "
            f"we = ((ow + 1) * {win.w} + {win.ow - 1}) / {win.ow};",
            "float s = 0.0f;",
            "for (int ih = hs; ih < he; ++ih)",
            f"for (int iw = ws; iw < we; ++iw) s += xp[(ih * {win.w} + iw)"
            f"{' * %d' % win.c if layout == 'NHWC' else ''}];",
            "v = s / (float)((he - hs) * (we - ws));"]


def _finish(compute: Compute, win: Window, layout: str) -> list[str]:
    """Per output column: the pooled value, the epilogue, the store."""
    o = (f"((nimg * {win.k} + ch) * {win.oh} + oh) * {win.ow} + ow" if layout == "NCHW" else
         f"((nimg * {win.oh} + oh) * {win.ow} + ow) * {win.k} + ch")
    lines = ["#pragma unroll", "for (int t = 0; t < TW; ++t) {",
             "const int ow = ow0 + t;", f"if (ow < {win.ow}) {{", f"const int o = {o};"]
    if win.kind == "adaptive":
        lines += ["float v;"] + _adaptive(win, layout)
    elif win.kind == "avg":
        lines += _avg_divisor(win) + ["float v = acc[t] / div;"]
    else:
        lines.append("float v = acc[t];")
    coords = {0: "nimg", 1: "ch", 2: "oh", 3: "ow"}
    lines += epilogue_lines(compute, "v", operand_reads(compute, "o", coords))
    return lines + ["out[o] = v;", "}", "}"]


def render_window(compute: Compute, win: Window, cfg: Config) -> CudaKernel:
    threads, tw = cfg["threads"], cfg["tw"]
    owt = math.ceil(win.ow / tw)
    total = win.work(tw)
    init = flit(float("-inf")) if win.kind == "max" else "0.0f"
    cin = f"ch / {win.k // win.c}" if win.kind == "depthwise" else "ch"
    layout = cfg["layout"]
    body = [f"constexpr int TW = {tw};",
            f"const int q = blockIdx.x * {threads} + threadIdx.x;",
            f"if (q >= {total}) return;"]
    if layout == "NCHW":
        body += [f"const int ow0 = q % {owt} * TW, oh = q / {owt} % {win.oh};",
                 f"const int ch = q / {owt * win.oh} % {win.k}, "
                 f"nimg = q / {owt * win.oh * win.k};",
                 f"const float* xp = in0 + (nimg * {win.c} + {cin}) * {win.h * win.w};"]
    else:  # channels fastest: a warp's threads read neighbouring addresses
        body += [f"const int ch = q % {win.k}, ow0 = q / {win.k} % {owt} * TW;",
                 f"const int oh = q / {win.k * owt} % {win.oh}, "
                 f"nimg = q / {win.k * owt * win.oh};",
                 f"const float* xp = in0 + nimg * {win.h * win.w * win.c} + {cin};"]
    if win.kind != "adaptive":
        body += ["float acc[TW];", "#pragma unroll",
                 f"for (int t = 0; t < TW; ++t) acc[t] = {init};"] + _taps(win, cfg)
    body += _finish(compute, win, layout)
    source = kernel_source(compute, threads, body)
    grid = check_grid((math.ceil(total / threads), 1, 1), compute.describe())
    return CudaKernel(kernel_name(compute), source, grid, (threads, 1, 1), 0,
                      buffers_of(compute))


def window_reason(c: Compute) -> str | None:
    if len(c.inputs[0].shape) != 4:
        return f"{c.op} on a {len(c.inputs[0].shape)}-D input (4-D only)"
    if c.op == "conv2d" and c.output.shape[1] % c.attr("groups"):
        return "output channels not a multiple of groups"
    return None
