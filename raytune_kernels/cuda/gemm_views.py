"""Conv2d, dense and matmul seen as one batched GEMM, for the CUDA renderer.

C[z][i][j] = sum_k A(z, i, k) * B(z, k, j), then the epilogue, stored at out(z, i, j).
Each view states, in C expressions over plain torch layouts, where A and B elements live,
which of their axes is contiguous in memory (the tile loader walks that axis fastest so
a warp's loads coalesce), whether 16-byte vector loads along it are legal (the extent is a
multiple of 4 and every row starts 16-byte aligned), and where each output element goes.

Why not the CPU LoopNest: that IR is shaped by x86 vectors (lanes, broadcast-FMA tiles,
pre-packed NCHW[x]c layouts, a fused parallel loop). A GPU kernel wants a different
decomposition (block tiles, thread tiles, shared-memory staging), so it is generated from
the same compute facts instead, in plain layouts that need no packing.

Conv2d is an implicit GEMM per (image, group): rows are the group's output channels,
columns the output pixels, and the reduction runs over (input channel, kh, kw) of the
group: A is the weight as it comes, B is gathered from the input (padding reads zero).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from raytune_kernels.task import Compute
from raytune_kernels.cuda.epilogue import (CudaLoweringError, broadcast_index, is_full,
                                            operand_specs)


class Ref(NamedTuple):
    """How to read one element: setup statements, a validity predicate (or ""), and
    its address as a C pointer expression."""

    lines: tuple[str, ...]
    pred: str
    addr: str


@dataclass(frozen=True)
class ConvGemm:
    nb: int
    c: int
    h: int
    w: int
    k_out: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    dil: tuple[int, int]
    groups: int

    a_contig, b_contig = "k", "x"
    weight = "a"  # the operand that reads in1 (a parameter wherever a network has one)

    @classmethod
    def from_compute(cls, c: Compute) -> "ConvGemm":
        nb, ch, h, w = c.inputs[0].shape
        k, _, kh, kw = c.inputs[1].shape
        _, _, oh, ow = c.output.shape
        return cls(nb, ch, h, w, k, kh, kw, oh, ow, tuple(c.attr("stride")),
                   tuple(c.attr("padding")), tuple(c.attr("dilation")), c.attr("groups"))

    batch = property(lambda self: self.nb * self.groups)
    m = property(lambda self: self.k_out // self.groups)
    n = property(lambda self: self.oh * self.ow)
    k = property(lambda self: self.c // self.groups * self.kh * self.kw)

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, no padding: B is the input itself, rows of contiguous pixels."""
        return (self.kh, self.kw, self.stride, self.pad) == (1, 1, (1, 1), (0, 0))

    a_vec = property(lambda self: self.k % 4 == 0)
    b_vec = property(lambda self: self.pointwise and self.n % 4 == 0)
    out_vec = property(lambda self: self.n % 4 == 0)

    def prologue(self) -> list[str]:
        cg, hw = self.c // self.groups, self.h * self.w
        return [f"const int nimg = z / {self.groups}, grp = z % {self.groups};",
                f"const float* __restrict__ xb = in0 + (nimg * {self.c} + grp * {cg}) * {hw};",
                f"const float* __restrict__ wb = in1 + grp * {self.m * self.k};",
                f"const int obase = (nimg * {self.k_out} + grp * {self.m}) * {self.n};"]

    def a(self, k: str, x: str) -> Ref:
        return Ref((), "", f"wb + {x} * {self.k} + {k}")

    def b(self, k: str, x: str) -> Ref:
        if self.pointwise:
            return Ref((), "", f"xb + {k} * {self.h * self.w} + {x}")
        taps = self.kh * self.kw
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.pad, self.dil
        lines = (f"const int cin = {k} / {taps}, tap = {k} % {taps};",
                 f"const int ih = {x} / {self.ow} * {sh} - {ph} + tap / {self.kw} * {dh};",
                 f"const int iw = {x} % {self.ow} * {sw} - {pw} + tap % {self.kw} * {dw};")
        # without padding every window lies inside the input (torch's output size)
        pred = "" if self.pad == (0, 0) else \
            f"(unsigned)ih < {self.h}u && (unsigned)iw < {self.w}u"
        return Ref(lines, pred, f"xb + (cin * {self.h} + ih) * {self.w} + iw")

    def out(self, i: str, j: str) -> str:
        return f"obase + ({i}) * {self.n} + ({j})"

    def coords(self, i: str, j: str) -> dict[int, str]:
        return {0: "nimg", 1: f"grp * {self.m} + ({i})"}


@dataclass(frozen=True)
class ConvGemmNHWC(ConvGemm):
    """Conv2d on NHWC activations: the implicit GEMM turned around, so that the store
    and the gathered operand walk channels, the contiguous axis of NHWC.

    Rows are output pixels, columns the group's output channels, and the reduction runs
    over (kh, kw, input channel), channel fastest: A is gathered from the input (a run of
    a pixel's channels is contiguous), B is the weight packed [K][kh][kw][C/g] (KRSC, by
    cuda_pack and the network planner), and C[pixel][channel] is stored NHWC."""

    a_contig, b_contig = "k", "k"
    weight = "b"

    m = property(lambda self: self.oh * self.ow)
    n = property(lambda self: self.k_out // self.groups)

    a_vec = property(lambda self: (self.c // self.groups) % 4 == 0)
    b_vec = property(lambda self: self.k % 4 == 0)
    out_vec = property(lambda self: self.n % 4 == 0)

    def prologue(self) -> list[str]:
        cg = self.c // self.groups
        return [f"const int nimg = z / {self.groups}, grp = z % {self.groups};",
                f"const float* __restrict__ xb = in0 + nimg * {self.h * self.w * self.c} "
                f"+ grp * {cg};",
                f"const float* __restrict__ wb = in1 + grp * {self.n * self.k};",
                f"const int obase = nimg * {self.m * self.k_out} + grp * {self.n};"]

    def a(self, k: str, x: str) -> Ref:
        if self.pointwise:
            return Ref((), "", f"xb + ({x}) * {self.c} + {k}")
        cg = self.c // self.groups
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.pad, self.dil
        lines = (f"const int tap = {k} / {cg}, cin = {k} % {cg};",
                 f"const int ih = {x} / {self.ow} * {sh} - {ph} + tap / {self.kw} * {dh};",
                 f"const int iw = {x} % {self.ow} * {sw} - {pw} + tap % {self.kw} * {dw};")
        pred = "" if self.pad == (0, 0) else \
            f"(unsigned)ih < {self.h}u && (unsigned)iw < {self.w}u"
        return Ref(lines, pred, f"xb + (ih * {self.w} + iw) * {self.c} + cin")

    def b(self, k: str, x: str) -> Ref:
        return Ref((), "", f"wb + ({x}) * {self.k} + {k}")

    def out(self, i: str, j: str) -> str:
        return f"obase + ({i}) * {self.k_out} + ({j})"

    def coords(self, i: str, j: str) -> dict[int, str]:
        return {0: "nimg", 1: f"grp * {self.n} + ({j})", 2: f"({i}) / {self.ow}",
                3: f"({i}) % {self.ow}"}


@dataclass(frozen=True)
class DenseGemm:
    """y[M, N] = x[M, K] @ w[N, K]^T; M is every leading axis of x flattened."""

    m: int
    n: int
    k: int
    rank: int

    batch = 1
    a_contig, b_contig = "k", "k"
    weight = "b"

    @classmethod
    def from_compute(cls, c: Compute) -> "DenseGemm":
        shape = c.inputs[0].shape
        return cls(math.prod(shape[:-1]), c.inputs[1].shape[0], shape[-1], len(shape))

    a_vec = property(lambda self: self.k % 4 == 0)
    b_vec = a_vec
    out_vec = property(lambda self: self.n % 4 == 0)

    def prologue(self) -> list[str]:
        return []

    def a(self, k: str, x: str) -> Ref:
        return Ref((), "", f"in0 + ({x}) * {self.k} + {k}")

    def b(self, k: str, x: str) -> Ref:
        return Ref((), "", f"in1 + ({x}) * {self.k} + {k}")

    def out(self, i: str, j: str) -> str:
        return f"({i}) * {self.n} + ({j})"

    def coords(self, i: str, j: str) -> dict[int, str]:
        return {self.rank - 1: f"({j})"}


@dataclass(frozen=True)
class MatmulGemm:
    """y[..., M, N] = x[..., M, K] @ w[..., K, N], batch axes broadcast as torch does."""

    out_batch: tuple[int, ...]
    a_batch: tuple[int, ...]
    b_batch: tuple[int, ...]
    m: int
    n: int
    k: int

    a_contig, b_contig = "k", "x"
    weight = "b"

    @classmethod
    def from_compute(cls, c: Compute) -> "MatmulGemm":
        a, b, o = c.inputs[0].shape, c.inputs[1].shape, c.output.shape
        if len(a) < 2 or len(b) < 2:
            raise CudaLoweringError("matmul of a 1-D operand (only matrices and batches "
                                    "of matrices are rendered)")
        return cls(tuple(o[:-2]), tuple(a[:-2]), tuple(b[:-2]), a[-2], b[-1], a[-1])

    batch = property(lambda self: math.prod(self.out_batch))
    a_vec = property(lambda self: self.k % 4 == 0)
    b_vec = property(lambda self: self.n % 4 == 0)
    out_vec = b_vec

    def prologue(self) -> list[str]:
        ai = broadcast_index("z", self.out_batch, self.a_batch) if self.a_batch else "0"
        bi = broadcast_index("z", self.out_batch, self.b_batch) if self.b_batch else "0"
        return [f"const float* __restrict__ ab = in0 + ({ai}) * {self.m * self.k};",
                f"const float* __restrict__ bb = in1 + ({bi}) * {self.k * self.n};",
                f"const int obase = z * {self.m * self.n};"]

    def a(self, k: str, x: str) -> Ref:
        return Ref((), "", f"ab + ({x}) * {self.k} + {k}")

    def b(self, k: str, x: str) -> Ref:
        return Ref((), "", f"bb + ({k}) * {self.n} + {x}")

    def out(self, i: str, j: str) -> str:
        return f"obase + ({i}) * {self.n} + ({j})"

    def coords(self, i: str, j: str) -> dict[int, str]:
        rank = len(self.out_batch) + 2
        return {rank - 2: f"({i})", rank - 1: f"({j})"}


Strides = tuple  # (A's, B's, the output's) element strides, each None where contiguous


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a row-major tensor of `shape`."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _broadcast(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """`strides` with stride 0 on every batch axis of one: never stepped along (an
    operand's is broadcast across the output's)."""
    return tuple(0 if d < len(shape) - 2 and n == 1 else x
                 for d, (n, x) in enumerate(zip(shape, strides)))


@dataclass(frozen=True)
class StridedMatmulGemm(MatmulGemm):
    """A matmul whose operands and output lie at given element strides: permuted views of
    contiguous buffers, read and written in place (attention's heads split off the
    projections' outputs and merged back, with no copy between), or one operand shared by
    every batch (stride 0: sibling denses of one input, cuda_plan.sibling_denses). Every
    operand has the output's rank; a batch axis of one broadcasts. Each matrix has a
    contiguous axis (stride 1), which the tile loaders walk and the vector loads take; the
    output's is its columns, for the epilogue's stores."""

    a_strides: tuple[int, ...] = ()
    b_strides: tuple[int, ...] = ()
    o_strides: tuple[int, ...] = ()

    @classmethod
    def from_strides(cls, c: Compute, strides: Strides) -> "StridedMatmulGemm":
        base = MatmulGemm.from_compute(c)
        shapes = (c.inputs[0].shape, c.inputs[1].shape, c.output.shape)
        full = []
        for st, shape in zip(strides, shapes):
            st = tuple(st) if st is not None else contiguous_strides(tuple(shape))
            if len(st) != len(shape) or len(shape) != len(c.output.shape):
                raise CudaLoweringError(f"strides {st} for an operand of shape {shape} "
                                        f"(a strided matmul's operands have the output's "
                                        f"{len(c.output.shape)} axes)")
            full.append(_broadcast(tuple(shape), st))
        a, b, o = full
        if 1 not in (a[-1], a[-2]) or 1 not in (b[-1], b[-2]):
            raise CudaLoweringError(f"strided matmul operands {a}, {b} with neither matrix "
                                    "axis contiguous")
        if o[-1] != 1:
            raise CudaLoweringError(f"strided matmul output {o}: its columns must be "
                                    "contiguous")
        plain = _broadcast(tuple(c.output.shape), contiguous_strides(tuple(c.output.shape)))
        if o != plain and any(
                is_full(op, spec, c.output.shape) for op, spec in operand_specs(c)):
            raise CudaLoweringError("a strided matmul output with an epilogue operand "
                                    "of its shape (read where the output would lie)")
        return cls(base.out_batch, base.a_batch, base.b_batch, base.m, base.n, base.k,
                   a, b, o)

    # A is [..., M, K], B [..., K, N]: contiguous along k, or along x (M of A, N of B)
    a_contig = property(lambda self: "k" if self.a_strides[-1] == 1 else "x")
    b_contig = property(lambda self: "x" if self.b_strides[-1] == 1 else "k")
    a_vec = property(lambda self: _vector_legal(self.a_strides, self.m, self.k,
                                                self.a_contig == "k"))
    b_vec = property(lambda self: _vector_legal(self.b_strides, self.k, self.n,
                                                self.b_contig == "x"))
    out_vec = property(lambda self: _vector_legal(self.o_strides, self.m, self.n, True))

    def _batch_offset(self, strides: tuple[int, ...]) -> str:
        terms, inner = [], 1
        for extent, stride in reversed(list(zip(self.out_batch, strides[:-2]))):
            if extent > 1 and stride:  # a broadcast operand's stride is 0
                terms.append(f"(z / {inner} % {extent}) * {stride}")
            inner *= extent
        return " + ".join(reversed(terms)) or "0"

    def prologue(self) -> list[str]:
        return [f"const float* __restrict__ ab = in0 + {self._batch_offset(self.a_strides)};",
                f"const float* __restrict__ bb = in1 + {self._batch_offset(self.b_strides)};",
                f"const int obase = {self._batch_offset(self.o_strides)};"]

    def a(self, k: str, x: str) -> Ref:
        return Ref((), "", f"ab + ({x}) * {self.a_strides[-2]} + ({k}) * {self.a_strides[-1]}")

    def b(self, k: str, x: str) -> Ref:
        return Ref((), "", f"bb + ({k}) * {self.b_strides[-2]} + ({x}) * {self.b_strides[-1]}")

    def out(self, i: str, j: str) -> str:
        return f"obase + ({i}) * {self.o_strides[-2]} + ({j})"

    def coords(self, i: str, j: str) -> dict[int, str]:
        """Every coordinate of the output element, the batch's from z (the element's
        offset is no flat index when the output is strided)."""
        out, inner = super().coords(i, j), 1
        for d in reversed(range(len(self.out_batch))):
            out[d] = f"(z / {inner} % {self.out_batch[d]})" if self.out_batch[d] > 1 else "0"
            inner *= self.out_batch[d]
        return out


def _vector_legal(strides: tuple[int, ...], rows: int, cols: int, cols_contig: bool) -> bool:
    """Whether 16-byte loads along a matrix's contiguous axis are legal: its extent is a
    multiple of 4 and every other stride too, so every run starts 16-byte aligned."""
    extent = cols if cols_contig else rows
    others = strides[:-1] if cols_contig else strides[:-2] + strides[-1:]
    return extent % 4 == 0 and all(s % 4 == 0 for s in others)


def gemm_view(c: Compute, layout: str = "NCHW", strides: Strides | None = None):
    """The GEMM view of a conv2d (other than one input channel per group), dense or
    matmul compute, with a conv's activations in `layout` (NCHW or NHWC); None for other
    ops. `strides` (a matmul's only): where its operands and output lie, when not
    contiguous (StridedMatmulGemm)."""
    if strides is not None:
        if c.op != "matmul":
            raise CudaLoweringError(f"strided operands of a {c.op} (a matmul's only)")
        return StridedMatmulGemm.from_strides(c, strides)
    if c.op == "conv2d":
        return (ConvGemmNHWC if layout == "NHWC" else ConvGemm).from_compute(c)
    if c.op == "dense":
        return DenseGemm.from_compute(c)
    if c.op == "matmul":
        return MatmulGemm.from_compute(c)
    return None
