"""Run a rendered CUDA kernel on the CPU: a NULL device that still executes the kernel's
own code, so the CUDA renderer is checked against the torch reference without a GPU.

The kernel's CUDA C is compiled as C++20 with a small shim: each thread of a block is a
std::thread, __syncthreads is a std::barrier over the block, a warp shuffle exchanges
through an array between two barriers over the warp, and blocks run one after another
(so `__shared__` arrays can be function statics). Buffers are heap arrays of exactly
their size and the program is built with AddressSanitizer: an out-of-bounds access (an
illegal memory access on a GPU) fails the run with ASan's report, and the alignment
sanitizer fails a float4 access that a GPU would fault on as misaligned (buffers are
256-byte aligned, as cudaMalloc's are). The output starts as NaN, so an element the kernel
never writes cannot pass the check.

Tensor cores (TENSOR_CORES, replacing the device functions of raytune_kernels/cuda/mma.py,
whose PTX this program does not compile): mma.sync is a warp-collective model of the PTX
ISA's fragment layouts (each lane publishes its A and B registers, every lane reads the
elements of its accumulators back from the lanes that hold them), operands rounded as the
conversions round (tf32 to nearest with ties away, fp16 and bf16 to nearest even) and
accumulated in float32. cp.async is a per-thread queue of copies grouped at each commit
and landed by the wait that covers their group; until then the destination holds NaN, so
a fragment read before its wait, or a slice overwritten while another warp still reads
it, shows in the output. A misaligned 16-byte copy fails the run, as it faults on a GPU.
This is for tests: it is slow (a thread per CUDA thread), so use small shapes.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy as np

from raytune_kernels.cuda.kernel import CudaKernel

SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>
#include <vector>
struct rk_dim3 { unsigned x, y, z; };
static thread_local rk_dim3 threadIdx, blockIdx;
static rk_dim3 blockDim, gridDim;
static std::barrier<>* rk_block_bar;
static std::barrier<>* rk_warp_bar[32];
static float rk_shfl[32][32];
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline void __syncthreads() { rk_block_bar->arrive_and_wait(); }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }  // a CUDA math function
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline float __ldcg(const float* p) { return *p; }
static inline float __shfl_xor_sync(unsigned, float v, int off) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  rk_shfl[w][lane] = v;
  rk_warp_bar[w]->arrive_and_wait();
  const float r = rk_shfl[w][lane ^ off];
  rk_warp_bar[w]->arrive_and_wait();
  return r;
}
using std::max;
using std::min;
"""

TENSOR_CORES = r"""
#define RK_EMULATED 1
#include <cstdint>
#include <cstdlib>
#include <deque>
static inline unsigned rk_bits(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float rk_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float x) { return rk_bits(x); }
static inline unsigned rk_tf32(float x) {  // cvt.rna: 10 mantissa bits, ties away from 0
  const unsigned u = rk_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;
  return (u + 0x1000u) & 0xffffe000u;
}
static inline unsigned rk_half_bits(float f) {  // float -> IEEE half, to nearest even
  const unsigned u = rk_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up round to infinity
  if (a < 0x38800000u)  // below 2^-14: a multiple of 2^-24, rounded to nearest even
    return sign | (unsigned)std::nearbyint(rk_float(a) * 16777216.0f);
  unsigned h = (((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13);
  const unsigned rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | h;
}
static inline float rk_half_value(unsigned h) {
  const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return (sign ? -1.0f : 1.0f) * std::ldexp((float)m, -24);
  if (e == 31) return rk_float(sign | 0x7f800000u | (m << 13));
  return rk_float(sign | ((e + 112u) << 23) | (m << 13));
}
static inline unsigned rk_bf16_bits(float f) {  // to nearest even
  const unsigned u = rk_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
static inline float rk_bf16_value(unsigned b) { return rk_float(b << 16); }
static inline unsigned rk_f16x2(float lo, float hi) {
  return rk_half_bits(lo) | (rk_half_bits(hi) << 16);
}
static inline unsigned rk_bf16x2(float lo, float hi) {
  return rk_bf16_bits(lo) | (rk_bf16_bits(hi) << 16);
}
static unsigned rk_frag_a[32][32][4], rk_frag_b[32][32][2];
enum rk_kind { RK_TF32, RK_FP16, RK_BF16 };
static inline float rk_elem(unsigned reg, int half, rk_kind kind) {
  if (kind == RK_TF32) return rk_float(reg & 0xffffe000u);  // the tensor core reads 19 bits
  const unsigned bits = (reg >> (16 * half)) & 0xffffu;
  return kind == RK_FP16 ? rk_half_value(bits) : rk_bf16_value(bits);
}
static inline float rk_a(int w, int row, int k, rk_kind kind) {  // A[16][K], row-major
  if (kind == RK_TF32)
    return rk_elem(rk_frag_a[w][(row & 7) * 4 + (k & 3)][(row >> 3) + 2 * (k >> 2)], 0, kind);
  return rk_elem(rk_frag_a[w][(row & 7) * 4 + ((k & 7) >> 1)][(row >> 3) + 2 * (k >> 3)],
                 k & 1, kind);
}
static inline float rk_b(int w, int k, int col, rk_kind kind) {  // B[K][8], column-major
  if (kind == RK_TF32) return rk_elem(rk_frag_b[w][col * 4 + (k & 3)][k >> 2], 0, kind);
  return rk_elem(rk_frag_b[w][col * 4 + ((k & 7) >> 1)][k >> 3], k & 1, kind);
}
static void rk_mma(float* d, const unsigned* a, const unsigned* b, rk_kind kind) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int depth = kind == RK_TF32 ? 8 : 16;
  for (int i = 0; i < 4; ++i) rk_frag_a[w][lane][i] = a[i];
  rk_frag_b[w][lane][0] = b[0];
  rk_frag_b[w][lane][1] = b[1];
  rk_warp_bar[w]->arrive_and_wait();
  float r[4];
  for (int q = 0; q < 4; ++q) {  // c0..c3 at (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
    const int row = g + 8 * (q >> 1), col = 2 * t + (q & 1);
    float s = d[q];
    for (int k = 0; k < depth; ++k) s += rk_a(w, row, k, kind) * rk_b(w, k, col, kind);
    r[q] = s;
  }
  rk_warp_bar[w]->arrive_and_wait();
  for (int q = 0; q < 4; ++q) d[q] = r[q];
}
static inline void rk_mma_tf32(float* d, const unsigned* a, const unsigned* b) { rk_mma(d, a, b, RK_TF32); }
static inline void rk_mma_fp16(float* d, const unsigned* a, const unsigned* b) { rk_mma(d, a, b, RK_FP16); }
static inline void rk_mma_bf16(float* d, const unsigned* a, const unsigned* b) { rk_mma(d, a, b, RK_BF16); }
struct rk_copy { float* dst; const float* src; int n; bool pred; };
static thread_local std::vector<rk_copy> rk_open;
static thread_local std::deque<std::vector<rk_copy>> rk_groups;
static inline void rk_cp_async(void* dst, const void* src, int bytes, bool pred) {
  if ((reinterpret_cast<std::uintptr_t>(dst) % bytes) ||
      (pred && reinterpret_cast<std::uintptr_t>(src) % bytes)) {
    std::fprintf(stderr, "misaligned %d-byte cp.async\n", bytes);
    std::abort();
  }
  float* d = static_cast<float*>(dst);
  for (int i = 0; i < bytes / 4; ++i) d[i] = NAN;  // not there until its wait
  rk_open.push_back({d, static_cast<const float*>(src), bytes / 4, pred});
}
static inline void rk_cp_async16(void* d, const void* s, bool p) { rk_cp_async(d, s, 16, p); }
static inline void rk_cp_async4(void* d, const void* s, bool p) { rk_cp_async(d, s, 4, p); }
static inline void rk_cp_async_commit() {
  rk_groups.push_back(std::move(rk_open));
  rk_open.clear();
}
template <int N> static inline void rk_cp_async_wait() {
  while (rk_groups.size() > (size_t)N) {
    for (const rk_copy& c : rk_groups.front())
      for (int i = 0; i < c.n; ++i) c.dst[i] = c.pred ? c.src[i] : 0.0f;
    rk_groups.pop_front();
  }
}
"""

RUNTIME = r"""
template <class F>
static void rk_launch(rk_dim3 grid, unsigned threads, F kernel) {
  gridDim = grid;
  blockDim = {threads, 1, 1};
  for (unsigned bz = 0; bz < grid.z; ++bz)
  for (unsigned by = 0; by < grid.y; ++by)
  for (unsigned bx = 0; bx < grid.x; ++bx) {
    std::barrier<> block(threads);
    std::vector<std::barrier<>*> warps;
    for (unsigned w = 0; w * 32 < threads; ++w)
      warps.push_back(rk_warp_bar[w] = new std::barrier<>(std::min(32u, threads - w * 32)));
    rk_block_bar = &block;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        threadIdx = {t, 0, 0};
        blockIdx = {bx, by, bz};
        kernel();
      });
    for (auto& t : ts) t.join();
    for (auto* w : warps) delete w;
  }
}

static bool rk_run(FILE* in, FILE* out, const std::vector<long>& sizes, rk_dim3 grid,
                   unsigned threads, void (*call)(float**), int launches) {
  std::vector<float*> b(sizes.size());
  bool ok = true;
  for (size_t i = 0; i < sizes.size(); ++i) {  // exact sizes (ASan guards the ends),
    // aligned as cudaMalloc aligns, so the alignment sanitizer sees what a GPU would
    b[i] = static_cast<float*>(::operator new[](sizes[i] * 4, std::align_val_t(256)));
    ok = ok && std::fread(b[i], 4, sizes[i], in) == (size_t)sizes[i];
  }
  for (int n = 0; ok && n < launches; ++n) {  // the same buffers, the output unwritten
    std::fill(b.back(), b.back() + sizes.back(), NAN);
    rk_launch(grid, threads, [&] { call(b.data()); });
  }
  std::fwrite(b.back(), 4, sizes.back(), out);
  for (auto* p : b) ::operator delete[](p, std::align_val_t(256));
  return ok;
}
"""
FLAGS = ("-std=c++20", "-O1", "-pthread", "-fno-omit-frame-pointer", "-fno-strict-aliasing",
         "-Wno-unknown-pragmas")
SANITIZERS = {  # bounds and float4 alignment, or data races between a block's threads
    "address": ("-fsanitize=address,alignment", "-fno-sanitize-recover=alignment"),
    "thread": ("-fsanitize=thread",),
}


class EmulationError(RuntimeError):
    """The emulated kernel did not compile or did not run cleanly (ASan's report)."""


def compiler() -> str | None:
    """The C++ compiler the emulator uses, or None when there is none."""
    return shutil.which("g++") or shutil.which("clang++")


def _unit(i: int, kernel: CudaKernel) -> str:
    """Kernel i in its own namespace under its own name (two configs of one compute share
    a kernel name), and a caller unpacking the buffer array into its arguments."""
    name = f"{kernel.name}_{i}"
    args = ", ".join(f"b[{j}]" for j in range(len(kernel.buffers)))
    return (f"namespace rk_k{i} {{\n{kernel.source.replace(kernel.name, name)}\n"
            f"static void call(float** b) {{ {name}({args}); }}\n}}\n")


def _main(kernels: list[CudaKernel], launches: int) -> str:
    runs = []
    for i, k in enumerate(kernels):
        sizes = ", ".join(str(b.size) for b in k.buffers)
        runs.append(f"ok = rk_run(in, out, {{{sizes}}}, {{{k.grid[0]}u, {k.grid[1]}u, "
                    f"{k.grid[2]}u}}, {k.threads}u, rk_k{i}::call, {launches}) && ok;")
    return ("int main(int argc, char** argv) {\n"
            "  FILE* in = std::fopen(argv[1], \"rb\"); FILE* out = std::fopen(argv[2], \"wb\");\n"
            "  bool ok = in && out;\n  " + "\n  ".join(runs) +
            "\n  std::fclose(in); std::fclose(out);\n  return ok ? 0 : 3;\n}\n")


def emulate(kernel: CudaKernel, arrays: list[np.ndarray], sanitizer: str = "address",
            timeout_s: float = 120.0) -> np.ndarray:
    """Run `kernel` on flat float32 arrays in buffer order (the output's content is
    ignored: it starts as NaN); returns the output buffer."""
    return emulate_many([(kernel, arrays)], sanitizer, timeout_s)[0]


def emulate_many(runs: list[tuple[CudaKernel, list[np.ndarray]]], sanitizer: str = "address",
                 timeout_s: float = 300.0, launches: int = 1) -> list[np.ndarray]:
    """Run several kernels from one compiled program (the C++ headers cost most of a
    build, so tests batch their kernels); returns each kernel's output buffer.
    sanitizer "address" checks bounds and alignment; "thread" reports a data race, such
    as shared memory read and written by two threads with no barrier between them.
    `launches` > 1 launches each kernel again on the same buffers (its output refilled
    with NaN first), as a network does: scratch state must be left as it was found."""
    if sanitizer not in SANITIZERS:
        raise ValueError(f"sanitizer {sanitizer!r}: expected one of {sorted(SANITIZERS)}")
    cxx = compiler()
    if cxx is None:
        raise EmulationError("no C++ compiler (g++ or clang++) to emulate CUDA with")
    data = []
    for kernel, arrays in runs:
        if [a.size for a in arrays] != [b.size for b in kernel.buffers]:
            raise ValueError(f"arrays of sizes {[a.size for a in arrays]} for buffers "
                             f"{[(b.name, b.size) for b in kernel.buffers]}")
        data += [np.asarray(a, np.float32).ravel() for a in arrays[:-1]]
        data.append(np.full(kernel.buffers[-1].size, np.nan, np.float32))
    kernels = [k for k, _ in runs]
    program = (SHIM + TENSOR_CORES + RUNTIME + "".join(_unit(i, k) for i, k in enumerate(kernels))
               + _main(kernels, launches))
    exe = _built(cxx, program, sanitizer)
    with tempfile.TemporaryDirectory(prefix="rk_emu_") as d:
        np.concatenate(data).tofile(os.path.join(d, "in.bin"))
        run = subprocess.run([exe, os.path.join(d, "in.bin"), os.path.join(d, "out.bin")],
                             capture_output=True, text=True, timeout=timeout_s)
        if run.returncode:
            raise EmulationError(f"emulated kernel failed ({run.returncode}):\n"
                                 f"{run.stderr[-4000:]}")
        flat = np.fromfile(os.path.join(d, "out.bin"), np.float32)
    bounds = np.cumsum([0] + [k.buffers[-1].size for k in kernels])
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


_BUILT: dict[str, str] = {}


def _built(cxx: str, program: str, sanitizer: str) -> str:
    """The executable of `program`, built once per process: an emulated network launches
    the same kernels again and again, and the build (a C++ program under a sanitizer) costs
    seconds where a run costs milliseconds. Inputs come from files, so a binary is reused
    for any data."""
    key = hashlib.sha256("\0".join((cxx, *FLAGS, *SANITIZERS[sanitizer], program))
                         .encode()).hexdigest()
    if key not in _BUILT:
        src, exe = os.path.join(_build_dir(), f"{key}.cpp"), os.path.join(_build_dir(), key)
        with open(src, "w") as f:
            f.write(program)
        proc = subprocess.run([cxx, *FLAGS, *SANITIZERS[sanitizer], src, "-o", exe],
                              capture_output=True, text=True)
        if proc.returncode:
            raise EmulationError(f"emulator build failed:\n{proc.stderr[-4000:]}")
        _BUILT[key] = exe
    return _BUILT[key]


@functools.lru_cache(maxsize=1)
def _build_dir() -> str:
    path = tempfile.mkdtemp(prefix="rk_emu_bin_")
    atexit.register(shutil.rmtree, path, True)
    return path
