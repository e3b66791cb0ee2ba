"""Tensor-core GEMM kernels (mma.sync) for every GEMM view, in tf32, fp16 or bf16 with
float32 accumulation.

A block is warps_m x warps_n warps; a warp computes a wm x wn tile of C as (wm/16) x
(wn/8) tiles of 16x8, one mma.sync each per k-step (8 deep for tf32, m16n8k8; 16 for
fp16/bf16, m16n8k16). The reduction advances bk at a time through a ring of `stages`
shared-memory slices filled by cp.async (copies from global to shared memory that hold no
register): while slice kt is multiplied, the copies of the next stages-1 slices are in
flight. With one stage the copy of a slice and its multiplication take turns.

Shared memory holds float32 operands as they are in global memory; each fragment is read
by the PTX ISA's layout for its instruction and rounded to the precision as it is read
(cvt.rna.tf32.f32, cvt.rn.f16x2.f32, cvt.rn.bf16x2.f32). So the buffers, their packing and
their layouts are those of the FFMA kernels (cuda/gemm.py), and one network mixes both
freely. An operand whose contiguous axis is k is stored [x][bk + pad], one contiguous
along x [k][bx + pad], each row padded (_pad) so that a warp's fragment loads touch every
bank once: 8 rows x 4 k in tf32 (pad 4 along k), and in fp16/bf16, whose registers pair
consecutive k, the pair read as one 8-byte load where k is contiguous (two 4-byte loads
at an even stride share banks two ways, whatever the padding). Rows stay 16-byte aligned
for cp.async's 16-byte copies.

Split-K (`split` > 1, cuda/split_k.py) cuts the reduction into ranges of whole slices,
one block each, for the small grids of a batch-1 network's late layers.

Knobs: the warp tile (wm, wn), the warps (warps_m, warps_n), the reduction slice bk, the
pipeline depth `stages`, each operand's copy width (va, vb: 4-byte or 16-byte cp.async,
where the view allows 16), and split. The precision is a knob of one value, so a config
names its arithmetic and renders alone.

The tensor-core instructions live in small device functions (PRELUDE); the CPU emulator
of the tests replaces them with a per-thread model of the same fragment layouts and of
cp.async's commit and wait groups, so every kernel is checked without a GPU.
"""
from __future__ import annotations

import functools
import math

from raytune_kernels.cuda import split_k
from raytune_kernels.cuda.epilogue import epilogue_lines, operand_reads
from raytune_kernels.cuda.gemm import MAX_SMEM_STATIC, load_steps, pow2_ceil
from raytune_kernels.cuda.gemm_views import Ref
from raytune_kernels.cuda.kernel import (CudaKernel, buffers_of, check_grid, kernel_name,
                                         kernel_source)
from raytune_kernels.space import Config, Space
from raytune_kernels.task import Compute

MMA_PRECISIONS = ("tf32", "fp16", "bf16")
MMA_KNOBS = ("wm", "wn", "warps_m", "warps_n", "bk", "stages", "va", "vb", "split")
K_STEP = {"tf32": 8, "fp16": 16, "bf16": 16}
MAX_ACC_TILES = 16  # 16x8 tiles a warp accumulates: 64 float registers a thread
# cp.async copies a thread issues per operand and slice: each unrolled copy of a gathered
# operand (a convolution's input) keeps its own index arithmetic live, and 8 of them (one
# warp, 4-byte copies) took ptxas to 254 registers and spills on sm_90
MAX_COPIES = 8
MAX_GATHERED_COPIES = 4

PRELUDE = r"""#ifndef RK_EMULATED
__device__ __forceinline__ unsigned rk_tf32(float x) {
  unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
__device__ __forceinline__ unsigned rk_f16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ unsigned rk_bf16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ void rk_mma_tf32(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void rk_mma_fp16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void rk_mma_bf16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void rk_cp_async16(void* dst, const void* src, bool pred) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(s), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void rk_cp_async4(void* dst, const void* src, bool pred) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
               :: "r"(s), "l"(src), "r"(pred ? 4 : 0));
}
__device__ __forceinline__ void rk_cp_async_commit() {
  asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void rk_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N));
}
#endif
"""


# bank conflicts a warp's fragment reads may have: the model of _conflicts (32 banks of
# 4 bytes; an 8-byte read served per half-warp), row paddings tried in order
PADS = tuple(range(4, 36, 4))


def _pairs(precision: str, contig: str) -> bool:
    """Whether a fragment register's two values are read as one 8-byte load: fp16/bf16
    pair consecutive k in a register, consecutive in memory where k is contiguous."""
    return precision != "tf32" and contig == "k"


def _fragment_words(precision: str, contig: str, stride: int) -> list[list[int]]:
    """The float offsets a warp's 32 lanes read, one list per load of a fragment register
    (PTX ISA layouts, g = lane / 4, t = lane % 4): row or column g at reduction index t
    (tf32) or 2t and 2t + 1 (fp16/bf16). An operand contiguous along k is stored
    [x][stride], one along x [k][stride]; the warp's own offsets (its tile, the k-step) add
    the same to every lane and leave the banks' conflicts as they are."""
    lanes = [(lane >> 2, lane & 3) for lane in range(32)]
    ks = (0,) if precision == "tf32" else (0, 1)
    scale = 1 if precision == "tf32" else 2
    if contig == "k":
        return [[g * stride + scale * t + d for g, t in lanes] for d in ks]
    return [[(scale * t + d) * stride + g for g, t in lanes] for d in ks]


def _conflicts(precision: str, contig: str, stride: int) -> int:
    """The most 4-byte words of one bank a fragment load of the warp reads (1: none): its
    32-bit loads as one request of 32 lanes, its 8-byte pair loads (_pairs) as two of 16."""
    def worst(words: list[int], bank) -> int:
        banks: dict[int, set[int]] = {}
        for w in words:
            banks.setdefault(bank(w), set()).add(w)
        return max(len(v) for v in banks.values())
    if _pairs(precision, contig):
        first = _fragment_words(precision, contig, stride)[0]
        return max(worst(half, lambda w: (w // 2) % 16) for half in (first[:16], first[16:]))
    return max(worst(words, lambda w: w % 32)
               for words in _fragment_words(precision, contig, stride))


@functools.lru_cache(maxsize=None)
def _pad(precision: str, contig: str, bk: int, bx: int) -> int:
    """Floats past each shared-memory row of an operand's slice ([x][bk] or [k][bx]): the
    fewest, in whole 16-byte units (cp.async's 16-byte copies land aligned), whose rows
    spread the warp's fragment reads over the banks without conflict; the least conflicted
    where none does. Kept per shape: a space's combinations ask for it thousands of
    times."""
    row = bk if contig == "k" else bx
    return min(PADS, key=lambda p: (_conflicts(precision, contig, row + p), p))


def _slice_floats(precision: str, contig: str, bk: int, bx: int) -> int:
    """Floats of one stage of an operand's bk x bx slice, padded (_pad)."""
    pad = _pad(precision, contig, bk, bx)
    return bx * (bk + pad) if contig == "k" else bk * (bx + pad)


def smem_bytes(view, precision: str, bm: int, bn: int, bk: int, stages: int) -> int:
    return 4 * stages * (_slice_floats(precision, view.a_contig, bk, bm) +
                         _slice_floats(precision, view.b_contig, bk, bn))


def _copy_widths(legal: bool, contig: str, tile_x: int) -> tuple[int, ...]:
    return (1, 4) if legal and (contig == "k" or tile_x % 4 == 0) else (1,)


def mma_space(view, precision: str) -> Space:
    """Rule-generated tensor-core space: whole warps (1-8 a block), at most MAX_ACC_TILES
    accumulator tiles a warp, block tiles no larger than the GEMM rounded up to a power of
    two (at least one mma tile), at most MAX_COPIES copies a thread per operand and
    slice (MAX_GATHERED_COPIES for a gathered one), and the ring of slices within static
    shared memory. Two stages of 16-deep slices in fp16/bf16 (one k-step a slice) are left
    out: every spilling kernel of a sweep over the zoo's GEMMs was of that kind, up to 255
    registers and 232 bytes of stack, where 1 or 3 stages of the same tiles used ~100."""
    if precision not in MMA_PRECISIONS:
        raise ValueError(f"no tensor-core kernels in precision {precision!r}")
    most_a, most_b = (MAX_GATHERED_COPIES if ref.lines else MAX_COPIES
                      for ref in (view.a("k", "x"), view.b("k", "x")))
    combos = []
    for wm, wn, warps_m, warps_n in _warp_tiles(view):
        bm, bn, threads = wm * warps_m, wn * warps_n, 32 * warps_m * warps_n
        for va in _copy_widths(view.a_vec, view.a_contig, bm):
            for vb in _copy_widths(view.b_vec, view.b_contig, bn):
                for bk in (b for b in (16, 32) if b == 16 or b <= pow2_ceil(view.k)):
                    if load_steps(bk, bm, threads, va) > most_a or \
                            load_steps(bk, bn, threads, vb) > most_b:
                        continue
                    for stages in (1, 2, 3):
                        if (stages, bk, K_STEP[precision]) == (2, 16, 16):
                            continue  # ptxas (NVRTC 13) spilled 5 in 405 zoo samples
                        if smem_bytes(view, precision, bm, bn, bk, stages) <= \
                                MAX_SMEM_STATIC:
                            combos += [(wm, wn, warps_m, warps_n, bk, stages, va, vb, sp)
                                       for sp in split_k.splits(view, bm, bn, bk)]
    if not combos:
        raise ValueError(f"no tensor-core tiling fits M={view.m} N={view.n} K={view.k}")
    return Space(MMA_KNOBS, tuple(combos), (("precision", (precision,)),))


def _warp_tiles(view):
    top_m, top_n = max(16, pow2_ceil(view.m)), max(8, pow2_ceil(view.n))
    for wm in (16, 32, 64):
        for wn in (8, 16, 32, 64):
            if (wm // 16) * (wn // 8) > MAX_ACC_TILES:
                continue
            for warps_m in (1, 2, 4):
                for warps_n in (1, 2, 4):
                    if warps_m * warps_n <= 8 and wm * warps_m <= top_m and \
                            wn * warps_n <= top_n:
                        yield wm, wn, warps_m, warps_n


# ------------------------------------------------------------------------------ rendering

def _at(name: str, contig: str, k: str, x: str) -> str:
    """The shared-memory element (k, x) of an operand's current slice."""
    return f"{name}[slot][{x}][{k}]" if contig == "k" else f"{name}[slot][{k}][{x}]"


def _copy_slice(smem: str, ref: Ref, contig: str, vec: int, bk: int, bx: int, x0: str,
                kext: int, xext: int, threads: int) -> list[str]:
    """cp.async of the bk x bx slice at reduction offset k0 into ring slot `dst`; elements
    outside the GEMM (or in a convolution's padding) are zero-filled by the copy."""
    total, per = bk * bx, threads * vec
    lines = []
    for step in range(-(-total // per)):
        body = [f"const int e = (tid + {step * threads}) * {vec};",
                f"const int kk = e % {bk}, xx = e / {bk};" if contig == "k" else
                f"const int kk = e / {bx}, xx = e % {bx};",
                f"const int k = k0 + kk, x = {x0} + xx;", *ref.lines]
        conds = ([f"k < {kext}"] if kext % bk else []) + ([f"x < {xext}"] if xext % bx else [])
        conds += [ref.pred] if ref.pred else []
        cond = " && ".join(conds) or "true"
        dst = f"&{smem}[dst][xx][kk]" if contig == "k" else f"&{smem}[dst][kk][xx]"
        body.append(f"rk_cp_async{4 * vec}({dst}, {ref.addr}, {cond});")
        if (step + 1) * per > total:  # a partial last step: threads past the slice idle
            body = [body[0], f"if (e < {total}) {{"] + body[1:] + ["}"]
        lines.append("{ " + " ".join(body) + " }")
    return lines


def _fragments(view, precision: str, mt: int, nt: int, rounded: bool = False) -> list[str]:
    """One k-step's A and B fragments from shared memory, rounded to the precision, and
    the mma of every accumulator tile (PTX ISA fragment layouts: g = lane / 4, t = lane % 4;
    tf32 A a0..a3 at (g, t), (g+8, t), (g, t+4), (g+8, t+4), B b0, b1 at (t, g), (t+4, g);
    f16/bf16 pairs two consecutive k in a register, low half first). `rounded` (tf32): the
    weight operand (view.weight) holds tf32 values already (rounded at packing), read as they
    are."""
    def a(r: str, k: str) -> str:
        return _at("As", view.a_contig, k, r)

    def b(c: str, k: str) -> str:
        return _at("Bs", view.b_contig, k, c)
    if precision == "tf32":
        cvt_a = "__float_as_uint" if rounded and view.weight == "a" else "rk_tf32"
        cvt_b = "__float_as_uint" if rounded and view.weight == "b" else "rk_tf32"
        a_regs = [f"{cvt_a}({a(r, k)})" for r, k in (("r", "ks + t"), ("r + 8", "ks + t"),
                                                     ("r", "ks + t + 4"),
                                                     ("r + 8", "ks + t + 4"))]
        b_regs = [f"{cvt_b}({b('c', k)})" for k in ("ks + t", "ks + t + 4")]
        a_stmts = [f"af[i][{q}] = {v};" for q, v in enumerate(a_regs)]
        b_stmts = [f"bf[j][{q}] = {v};" for q, v in enumerate(b_regs)]
    else:
        pack = "rk_f16x2" if precision == "fp16" else "rk_bf16x2"

        def pair(reg: str, at, contig: str, x: str, k: str) -> str:
            """`reg` = the values at k and k + 1 packed, read as one 8-byte load where
            they are adjacent in memory (_pairs), else as two."""
            if _pairs(precision, contig):
                return (f"{{ const float2 p = *reinterpret_cast<const float2*>(&{at(x, k)}); "
                        f"{reg} = {pack}(p.x, p.y); }}")
            return f"{reg} = {pack}({at(x, k)}, {at(x, k + ' + 1')});"
        a_stmts = [pair(f"af[i][{q}]", a, view.a_contig, r, k) for q, (r, k) in enumerate(
            (("r", "ks + 2 * t"), ("r + 8", "ks + 2 * t"), ("r", "ks + 2 * t + 8"),
             ("r + 8", "ks + 2 * t + 8")))]
        b_stmts = [pair(f"bf[j][{q}]", b, view.b_contig, "c", k)
                   for q, k in enumerate(("ks + 2 * t", "ks + 2 * t + 8"))]
    lines = [f"unsigned af[{mt}][4], bf[{nt}][2];", "#pragma unroll",
             f"for (int i = 0; i < {mt}; ++i) {{", "const int r = wr + i * 16 + g;"]
    lines += a_stmts + ["}", "#pragma unroll", f"for (int j = 0; j < {nt}; ++j) {{",
                        "const int c = wc + j * 8 + g;"]
    lines += b_stmts + ["}"]
    lines += ["#pragma unroll", f"for (int i = 0; i < {mt}; ++i)", "#pragma unroll",
              f"for (int j = 0; j < {nt}; ++j) rk_mma_{precision}(acc[i][j], af[i], bf[j]);"]
    return lines


def _store(compute: Compute, view, mt: int, nt: int, bm: int, bn: int) -> list[str]:
    """The epilogue and store of every accumulator: c0..c3 of a tile at rows g, g, g+8,
    g+8 and columns 2t, 2t+1, 2t, 2t+1."""
    conds = ([f"i < {view.m}"] if view.m % bm else []) + ([f"j < {view.n}"] if view.n % bn else [])
    epi = epilogue_lines(compute, "v", operand_reads(compute, "o", view.coords("i", "j")))
    return ["#pragma unroll", f"for (int a = 0; a < {mt}; ++a)", "#pragma unroll",
            f"for (int b = 0; b < {nt}; ++b)", "#pragma unroll", "for (int q = 0; q < 4; ++q) {",
            "const int i = i0 + wr + a * 16 + g + (q >> 1) * 8;",
            "const int j = j0 + wc + b * 8 + 2 * t + (q & 1);",
            f"if ({' && '.join(conds)}) {{" if conds else "{",
            f"const int o = {view.out('i', 'j')};", "float v = acc[a][b][q];", *epi,
            "out[o] = v;", "}", "}"]


def render_mma(compute: Compute, view, cfg: Config, rounded: bool = False) -> CudaKernel:
    """The kernel of a tensor-core config; `rounded`: in tf32, the weight operand is read
    as it lies, its values rounded to tf32 once, when the network packs them (_fragments),
    instead of by a cvt at every fragment read."""
    wm, wn, warps_m, warps_n, bk, stages = (cfg[k] for k in MMA_KNOBS[:6])
    precision, split = cfg["precision"], cfg["split"]
    bm, bn, threads = wm * warps_m, wn * warps_n, 32 * warps_m * warps_n
    mt, nt = wm // 16, wn // 8
    pa, pb = _pad(precision, view.a_contig, bk, bm), _pad(precision, view.b_contig, bk, bn)
    ka, kb = ((bm, bk + pa) if view.a_contig == "k" else (bk, bm + pa)), \
        ((bn, bk + pb) if view.b_contig == "k" else (bk, bn + pb))
    body = [f"__shared__ __align__(16) float As[{stages}][{ka[0]}][{ka[1]}];",
            f"__shared__ __align__(16) float Bs[{stages}][{kb[0]}][{kb[1]}];",
            "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;",
            "const int g = lane >> 2, t = lane & 3;",
            f"const int wr = warp / {warps_n} * {wm}, wc = warp % {warps_n} * {wn};",
            f"const int i0 = blockIdx.y * {bm}, j0 = blockIdx.x * {bn};"]
    body += split_k.block_index(split, view.prologue())
    body.append(split_k.k_range(split, -(-view.k // bk)))
    body += [f"float acc[{mt}][{nt}][4];", "#pragma unroll",
             f"for (int i = 0; i < {mt}; ++i)", "#pragma unroll",
             f"for (int j = 0; j < {nt}; ++j)", "#pragma unroll",
             "for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;"]
    copy = (_copy_slice("As", view.a("k", "x"), view.a_contig, cfg["va"], bk, bm, "i0",
                        view.k, view.m, threads)
            + _copy_slice("Bs", view.b("k", "x"), view.b_contig, cfg["vb"], bk, bn, "j0",
                          view.k, view.n, threads))
    body += _pipeline(copy, stages, bk)
    body += ["#pragma unroll", f"for (int ks = 0; ks < {bk}; ks += {K_STEP[precision]}) {{"]
    body += _fragments(view, precision, mt, nt, rounded and precision == "tf32") + ["}", "}"]
    if split > 1:
        body += split_k.meet(split, bm * bn, (mt, nt, 4))
    body += _store(compute, view, mt, nt, bm, bn)
    buffers = buffers_of(compute, split_k.scratch(view, bm, bn, split))
    source = kernel_source(compute, threads, body, PRELUDE, buffers)
    grid = check_grid((math.ceil(view.n / bn), math.ceil(view.m / bm), view.batch * split),
                      compute.describe())
    return CudaKernel(kernel_name(compute), source, grid, (threads, 1, 1), 0, buffers)


def _pipeline(copy: list[str], stages: int, bk: int) -> list[str]:
    """The loop over this block's nk slices (from slice kbeg), up to the multiplication of
    ring slot `slot`. With S stages the first S-1 slices are in flight before the loop;
    iteration kt waits until at most S-2 groups are outstanding (slice kt has landed),
    synchronises the block (so every warp is done with slot (kt-1) % S), then starts the
    copy of slice kt+S-1 into that slot. Every iteration commits one group, empty past the
    last slice, so the count stays exact."""
    def issue(kt: str) -> list[str]:
        return ["{", f"const int k0 = (kbeg + {kt}) * {bk}, dst = ({kt}) % {stages};",
                *copy, "}"]
    if stages == 1:
        return ["for (int kt = 0; kt < nk; ++kt) {", "const int slot = 0;",
                "__syncthreads();", *issue("kt"), "rk_cp_async_commit();",
                "rk_cp_async_wait<0>();", "__syncthreads();"]
    lines = []
    for s in range(stages - 1):
        lines += ([f"if ({s} < nk) {{", *issue(str(s)), "}"] if s else issue("0"))
        lines.append("rk_cp_async_commit();")
    return lines + ["for (int kt = 0; kt < nk; ++kt) {",
                    f"const int slot = kt % {stages};",
                    f"rk_cp_async_wait<{stages - 2}>();", "__syncthreads();",
                    f"if (kt + {stages - 1} < nk) {{", *issue(f"kt + {stages - 1}"), "}",
                    "rk_cp_async_commit();"]
