"""Refilling a bordered buffer's border, so that its memory can serve other values too.

A windowed kernel reads its input with the padding stored around it (NCHW16c/p1x1), and no
kernel writes that border: it is filled when the buffer is made. A buffer whose memory
only ever holds values of that same geometry keeps its border for good. Sharing the memory
with other values (plain ones, other geometries) instead keeps a network's activations in
fewer distinct bytes (MobileNetV2: 22 MB in 17 arrays, 11 of them bordered, one per
geometry, on top of 14 MB of weights: more than a 32 MB L3 holds from one
inference to the next), at the price of writing the border again before each writer: a
few runs of floats per row.

`border_runs` lists where the border lies in a layout's flat memory; `fill_kernel` is the
native call that writes `value` there, `void rk_fill_border(ptr buffer, ptr runs, i32)`
(the thread count, as every kernel of a network takes it, is ignored: borders are small).
"""
from __future__ import annotations

import functools

import numpy as np

from raytune_kernels.cpu.build import LoadedKernel, build
from raytune_kernels.cpu.llvm.text import F32, const
from raytune_kernels.cpu.transform import Layout
from raytune_kernels.errors import CompileError

NAME = "rk_fill_border"


def border_runs(layout: Layout, shape: tuple[int, ...], below: int | None = None
                ) -> np.ndarray:
    """int64 [n, start_0, length_0, ..., start_n-1, length_n-1]: the border of a
    `layout` buffer of `shape`, as runs of consecutive floats in its flat memory; with
    `below`, only the part of it in the first `below` floats."""
    import torch
    mask = layout.pack(torch.zeros(shape), border=1.0) != 0
    if below is not None:
        mask[below:] = False
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    starts, ends = edges[0::2], edges[1::2]
    runs = np.stack([starts, ends - starts], 1).ravel()
    return np.concatenate(([len(starts)], runs)).astype(np.int64)


def fill_ir(value: float) -> str:
    """IR text of the fill: for each run, `value` stored from `start` on, sixteen floats at
    a time (one vector store) while sixteen remain, then one at a time (one scalar store a
    float made MobileNetV2's 18 refills 124 us a run)."""
    v = const(F32, value).ref
    return f"""define void @{NAME}(ptr %buf, ptr %runs, i32 %threads) {{
entry:
  %n = load i64, ptr %runs, align 8
  %any = icmp sgt i64 %n, 0
  br i1 %any, label %run, label %done
run:
  %i = phi i64 [0, %entry], [%i.next, %tail.done]
  %k = shl i64 %i, 1
  %ps = getelementptr inbounds i64, ptr %runs, i64 %k
  %p.start = getelementptr inbounds i64, ptr %ps, i64 1
  %p.len = getelementptr inbounds i64, ptr %ps, i64 2
  %start = load i64, ptr %p.start, align 8
  %len = load i64, ptr %p.len, align 8
  %base = getelementptr inbounds float, ptr %buf, i64 %start
  %vecs = lshr i64 %len, 4
  %has.vec = icmp sgt i64 %vecs, 0
  br i1 %has.vec, label %vec, label %vec.done
vec:
  %j = phi i64 [0, %run], [%j.next, %vec]
  %jf = shl i64 %j, 4
  %pv = getelementptr inbounds float, ptr %base, i64 %jf
  store <16 x float> splat (float {v}), ptr %pv, align 4
  %j.next = add nuw nsw i64 %j, 1
  %more = icmp slt i64 %j.next, %vecs
  br i1 %more, label %vec, label %vec.done
vec.done:
  %t0 = shl i64 %vecs, 4
  %has.tail = icmp slt i64 %t0, %len
  br i1 %has.tail, label %tail, label %tail.done
tail:
  %t = phi i64 [%t0, %vec.done], [%t.next, %tail]
  %pt = getelementptr inbounds float, ptr %base, i64 %t
  store float {v}, ptr %pt, align 4
  %t.next = add nuw nsw i64 %t, 1
  %again.t = icmp slt i64 %t.next, %len
  br i1 %again.t, label %tail, label %tail.done
tail.done:
  %i.next = add nuw nsw i64 %i, 1
  %again = icmp slt i64 %i.next, %n
  br i1 %again, label %run, label %done
done:
  ret void
}}
"""


@functools.lru_cache(maxsize=8)
def fill_kernel(value: float) -> LoadedKernel:
    """The loaded fill for `value` (0.0 before a conv, -inf before a max pool)."""
    built = build(fill_ir(value), persist=True)
    if built.error:
        raise CompileError(f"the border fill ({value}) did not build: {built.error}")
    return LoadedKernel(built.library, NAME, 2)
