"""Tiled GEMM kernels in CUDA C for every GEMM view (conv2d, dense, matmul).

A block computes a bm x bn tile of C for one batch index z; its threads each hold a
tm x tn register tile (fully unrolled FMAs). The reduction advances bk at a time: the
block stages the bk-deep slices of A and B in shared memory (loaded cooperatively along
each operand's contiguous axis, as float4 where the view allows it), synchronises, and
every thread runs bk rank-1 updates of its register tile from shared memory. The epilogue
is applied to the register tile and stored (as float4 where columns allow it).

With `prefetch`, the next reduction slices are loaded from global memory into registers
before the rank-1 updates of the current ones, and written to shared memory after them:
the loads' latency hides behind the arithmetic, for the registers that hold them.

Split-K (`split` > 1, cuda/split_k.py): the reduction cut into ranges of whole slices, one
block each, for the small grids of a batch-1 network's late layers.

Knobs: the block tile (bm, bn), the thread tile (tm, tn), whether a thread's rows and
columns are contiguous or interleaved by the thread grid (`interleave`: conflict-free
shared-memory reads and coalesced stores against wider contiguous accesses), the vector
width of each operand's global loads (va, vb), the reduction tile bk, register prefetch
of the next slices, the split, and the unroll factor of the loop over bk. Threads per
block follow from the tiles: (bm/tm) * (bn/tn).
"""
from __future__ import annotations

import math

from raytune_kernels.task import Compute
from raytune_kernels.cuda import split_k
from raytune_kernels.cuda.epilogue import epilogue_lines, operand_reads, uses
from raytune_kernels.cuda.gemm_views import Ref
from raytune_kernels.cuda.kernel import (CudaKernel, buffers_of, check_grid, kernel_name,
                                         kernel_source)
from raytune_kernels.space import Config, Space

REGS_PER_SM = 65536
REG_OVERHEAD = 24  # indices, loop counters, base pointers (estimate per thread)
MAX_REGS = 160  # estimate ceiling: well below ptxas's 255, which spills when reached
MAX_LOAD_STEPS = 8
MAX_SMEM_STATIC = 48 * 1024
GEMM_KNOBS = ("bm", "bn", "tm", "tn", "interleave", "va", "vb", "bk", "prefetch", "split")


def pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def tile_options(extent: int, largest: int = 128) -> tuple[int, ...]:
    """Block tile sizes: powers of two up to the extent (rounded up), at least 16 where
    the extent allows, so no block is mostly idle and none is trivially small."""
    top = min(largest, pow2_ceil(extent))
    low = min(16, top)
    return tuple(p for p in (1, 2, 4, 8, 16, 32, 64, 128) if low <= p <= top)


def _vec_options(legal: bool, contig: str, tile_x: int) -> tuple[int, ...]:
    ok = legal and (contig == "k" or tile_x % 4 == 0)
    return (1, 4) if ok else (1,)


def load_steps(bk: int, bx: int, threads: int, vec: int) -> int:
    """Unrolled load instructions per thread for one operand's bk x bx slice."""
    return -(-bk * bx // (threads * vec))


def register_estimate(tm: int, tn: int, steps: int) -> int:
    """Registers a thread needs: the accumulator tile, one column of A and row of B, and
    for every unrolled load step an address the compiler keeps live across the k loop."""
    return tm * tn + tm + tn + 3 * steps + REG_OVERHEAD


def gemm_space(view) -> Space:
    """Rule-generated GEMM space: threads a multiple of 32 in [32, 512]; at most
    MAX_LOAD_STEPS unrolled loads per operand; the register estimate within the per-thread
    budget and, times the threads, within the SM's register file."""
    combos = []
    bks = tuple(b for b in (8, 16, 32) if b == 8 or b <= pow2_ceil(view.k))
    for bm, bn, tm, tn in _tiles(view):
        threads = (bm // tm) * (bn // tn)
        for inter in (False, True) if tm * tn > 1 else (False,):
            for va in _vec_options(view.a_vec, view.a_contig, bm):
                for vb in _vec_options(view.b_vec, view.b_contig, bn):
                    for bk in bks:
                        sa, sb = load_steps(bk, bm, threads, va), load_steps(bk, bn, threads, vb)
                        for pre in (False, True):
                            regs = register_estimate(tm, tn, sa + sb) + \
                                (sa * va + sb * vb if pre else 0)  # the staged slices
                            if max(sa, sb) > MAX_LOAD_STEPS or regs > MAX_REGS or \
                                    threads * regs > REGS_PER_SM:
                                continue
                            combos += [(bm, bn, tm, tn, inter, va, vb, bk, pre, sp)
                                       for sp in split_k.splits(view, bm, bn, bk)]
    if not combos:
        raise ValueError(f"no GEMM tiling fits M={view.m} N={view.n} K={view.k}")
    return Space(GEMM_KNOBS, tuple(combos), (("unroll", (1, 4, 8)),))


def _tiles(view):
    """(bm, bn, tm, tn) with 32..512 threads, a whole number of warps. A block of one row
    (M = 1: a batch-1 dense) may be wider than N, so that a narrow N (a 10-class head)
    still gives a warp its 32 columns (the kernel guards columns past N)."""
    for bm in tile_options(view.m):
        for bn in tile_options(max(view.n, 32 // bm)):
            for tm in (t for t in (1, 2, 4, 8) if t <= bm):
                for tn in (t for t in (1, 2, 4, 8) if t <= bn):
                    threads = (bm // tm) * (bn // tn)
                    if threads % 32 == 0 and 32 <= threads <= 512:
                        yield bm, bn, tm, tn


def _pad(contig: str) -> int:
    """Shared-memory row padding: a loader walking k writes down a column, so pad the row
    (by 4, keeping float4 alignment) to spread those writes over banks."""
    return 4 if contig == "k" else 0


def _load_tile(smem: str, ref: Ref, contig: str, vec: int, bk: int, bx: int, x0: str,
               kext: int, xext: int, threads: int, part: str = "both",
               k0: str = "k0") -> list[str]:
    """Cooperative load of a bk x bx slice into smem[bk][bx + pad], zero outside.

    part "both" loads and stores; "fetch" loads the slice at reduction offset `k0` into
    registers {smem}_r<step> (declared by the caller, see staging_registers), "store"
    writes those registers to shared memory."""
    total, per = bk * bx, threads * vec
    lines = []
    for step in range(-(-total // per)):
        reg = f"{smem}_r{step}"
        body = [f"const int e = (tid + {step * threads}) * {vec};"]
        body += [f"const int kk = e % {bk}, xx = e / {bk};" if contig == "k" else
                 f"const int kk = e / {bx}, xx = e % {bx};"]
        if part != "store":
            body.append(f"const int k = {k0} + kk, x = {x0} + xx;")
            body += list(ref.lines)
            conds = ([f"k < {kext}"] if kext % bk else []) + \
                ([f"x < {xext}"] if xext % bx else [])
            conds += [ref.pred] if ref.pred else []
            cond = " && ".join(conds)
        value = reg if part == "store" else "t"
        if vec == 1:
            if part != "store":
                got = f"({cond}) ? *({ref.addr}) : 0.0f" if cond else f"*({ref.addr})"
                body.append(f"{reg} = {got};" if part == "fetch" else f"const float t = {got};")
            if part != "fetch":
                body.append(f"{smem}[kk][xx] = {value};")
        else:
            if part != "store":
                load = f"t = *reinterpret_cast<const float4*>({ref.addr});"
                body += ["float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);",
                         f"if ({cond}) {load}" if cond else load]
                if part == "fetch":
                    body.append(f"{reg} = t;")
            if part != "fetch":
                for q, lane in enumerate("xyzw"):
                    at = f"[kk + {q}][xx]" if contig == "k" else f"[kk][xx + {q}]"
                    body.append(f"{smem}{at} = {value}.{lane};")
        if (step + 1) * per > total:  # the last step is partial: threads past the tile idle
            body = [body[0], f"if (e < {total}) {{"] + body[1:] + ["}"]
        lines.append("{ " + " ".join(body) + " }")
    return lines


def staging_registers(smem: str, vec: int, bk: int, bx: int, threads: int) -> list[str]:
    """Declarations of the registers a prefetched slice is staged in (zeroed: a partial
    last step leaves some unused)."""
    kind, zero = ("float", "0.0f") if vec == 1 else \
        ("float4", "make_float4(0.0f, 0.0f, 0.0f, 0.0f)")
    steps = load_steps(bk, bx, threads, vec)
    return [f"{kind} {smem}_r{s} = {zero};" for s in range(steps)]


def _pos(t: str, n: str, tile: int, block: int, interleave: bool) -> str:
    """Offset in the block tile of a thread's n-th row/column (t: thread coordinate)."""
    return f"{t} + {n} * {block // tile}" if interleave else f"{t} * {tile} + {n}"


def _store(compute: Compute, view, cfg: Config, vec: int) -> list[str]:
    """The epilogue and store of the register tile, `vec` columns at a time."""
    bm, bn, tm, tn, inter = (cfg[k] for k in ("bm", "bn", "tm", "tn", "interleave"))
    lines = ["#pragma unroll", f"for (int r = 0; r < {tm}; ++r) {{",
             f"const int i = i0 + {_pos('ty', 'r', tm, bm, inter)};",
             "#pragma unroll", f"for (int c = 0; c < {tn}; c += {vec}) {{",
             f"const int j = j0 + {_pos('tx', 'c', tn, bn, inter)};"]
    conds = ([f"i < {view.m}"] if view.m % bm else []) + ([f"j < {view.n}"] if view.n % bn else [])
    lines.append(f"if ({' && '.join(conds)}) {{" if conds else "{")
    for q in range(vec):
        j = f"j + {q}" if q else "j"
        o, v = f"o{q}", f"v{q}"
        epi = epilogue_lines(compute, v, operand_reads(compute, o, view.coords("i", j)))
        if q == 0 or uses(o, epi):  # declare no unused index variables
            lines.append(f"const int {o} = {view.out('i', j)};")
        lines += [f"float {v} = acc[r][c + {q}];"] + epi
    if vec == 1:
        lines.append("out[o0] = v0;")
    else:
        lines.append("*reinterpret_cast<float4*>(out + o0) = make_float4(v0, v1, v2, v3);")
    return lines + ["}", "}", "}"]


def render_gemm(compute: Compute, view, cfg: Config) -> CudaKernel:
    bm, bn, tm, tn, bk = (cfg[k] for k in ("bm", "bn", "tm", "tn", "bk"))
    inter, threads = cfg["interleave"], (bm // tm) * (bn // tn)
    pa, pb = _pad(view.a_contig), _pad(view.b_contig)
    smem = 4 * bk * (bm + pa + bn + pb)
    if smem > MAX_SMEM_STATIC:
        raise ValueError(f"bk={bk}, bm={bm}, bn={bn} need {smem} bytes of shared memory")
    vec_out = 4 if (view.out_vec and tn % 4 == 0 and not inter) else 1
    body = [f"__shared__ __align__(16) float As[{bk}][{bm + pa}];",
            f"__shared__ __align__(16) float Bs[{bk}][{bn + pb}];",
            "const int tid = threadIdx.x;",
            f"const int tx = tid % {bn // tn}, ty = tid / {bn // tn};",
            f"const int i0 = blockIdx.y * {bm}, j0 = blockIdx.x * {bn};"]
    split = split_k.config_split(cfg)
    body += split_k.block_index(split, view.prologue())
    if split == 1:
        k_lo, k_hi = "0", str(view.k)
    else:  # this block's range of whole slices (its last may pass K: loads guard k < K)
        body.append(split_k.k_range(split, -(-view.k // bk)))
        body.append(f"const int k_lo = kbeg * {bk}, k_hi = (kbeg + nk) * {bk};")
        k_lo, k_hi = "k_lo", "k_hi"
    body += [f"float acc[{tm}][{tn}];", "#pragma unroll",
             f"for (int r = 0; r < {tm}; ++r)", "#pragma unroll",
             f"for (int c = 0; c < {tn}; ++c) acc[r][c] = 0.0f;"]
    a_tile = ("As", view.a("k", "x"), view.a_contig, cfg["va"], bk, bm, "i0", view.k,
              view.m, threads)
    b_tile = ("Bs", view.b("k", "x"), view.b_contig, cfg["vb"], bk, bn, "j0", view.k,
              view.n, threads)
    if cfg["prefetch"]:  # the first slices into registers; each round stores them, then
        # fetches the next before computing, so the global loads overlap the FMAs
        body += staging_registers("As", cfg["va"], bk, bm, threads)
        body += staging_registers("Bs", cfg["vb"], bk, bn, threads)
        body += _load_tile(*a_tile, part="fetch", k0=k_lo)
        body += _load_tile(*b_tile, part="fetch", k0=k_lo)
        body.append(f"for (int k0 = {k_lo}; k0 < {k_hi}; k0 += {bk}) {{")
        body += _load_tile(*a_tile, part="store") + _load_tile(*b_tile, part="store")
        body += ["__syncthreads();", f"if (k0 + {bk} < {k_hi}) {{"]
        body += _load_tile(*a_tile, part="fetch", k0=f"(k0 + {bk})")
        body += _load_tile(*b_tile, part="fetch", k0=f"(k0 + {bk})") + ["}"]
    else:
        body.append(f"for (int k0 = {k_lo}; k0 < {k_hi}; k0 += {bk}) {{")
        body += _load_tile(*a_tile) + _load_tile(*b_tile)
        body.append("__syncthreads();")
    body += [f"#pragma unroll {cfg['unroll']}",
             f"for (int kk = 0; kk < {bk}; ++kk) {{", f"float a[{tm}], b[{tn}];",
             "#pragma unroll",
             f"for (int r = 0; r < {tm}; ++r) a[r] = As[kk][{_pos('ty', 'r', tm, bm, inter)}];",
             "#pragma unroll",
             f"for (int c = 0; c < {tn}; ++c) b[c] = Bs[kk][{_pos('tx', 'c', tn, bn, inter)}];",
             "#pragma unroll", f"for (int r = 0; r < {tm}; ++r)", "#pragma unroll",
             f"for (int c = 0; c < {tn}; ++c) acc[r][c] = fmaf(a[r], b[c], acc[r][c]);",
             "}", "__syncthreads();", "}"]
    if split > 1:
        body += split_k.meet(split, bm * bn, (tm, tn))
    body += _store(compute, view, cfg, vec_out)
    buffers = buffers_of(compute, split_k.scratch(view, bm, bn, split))
    source = kernel_source(compute, threads, body, buffers=buffers)
    grid = check_grid((math.ceil(view.n / bn), math.ceil(view.m / bm), view.batch * split),
                      compute.describe())
    return CudaKernel(kernel_name(compute), source, grid, (threads, 1, 1), 0, buffers)
