"""Row kernels in CUDA C: softmax (any axis), layer norm, reductions of the last axis
(sum, mean, max, min), and bare elementwise tasks.

Softmax, layer norm and reductions give each row to one block: its threads stride over
the row (`vec` floats at a time where the row is contiguous and vec divides it), reduce
through warp shuffles and a 32-float shared array, and write the row (a reduction: its
one value, by thread 0) with the epilogue fused.
Elementwise tasks are a flat map: each thread handles `items` vectors of `vec` floats,
spaced a block apart so that every load instruction of a warp is contiguous.
Knobs: threads per block, vec, and (elementwise) items per thread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from raytune_kernels.task import Compute
from raytune_kernels.cuda.epilogue import (CudaLoweringError, epilogue_lines, flit, is_full,
                                           operand_reads, operand_specs, uses)
from raytune_kernels.cuda.kernel import (CudaKernel, buffers_of, check_grid, kernel_name,
                                         kernel_source)
from raytune_kernels.space import Config, Space

ROW_OPS = ("softmax", "layer_norm", "reduce")
_LANES = "xyzw"

REDUCE_HELPERS = """\
struct rk_sum { __device__ float operator()(float a, float b) const { return a + b; } };
struct rk_max { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
template <class Op>
static __device__ __forceinline__ float rk_block_reduce(float v, float* red, float init) {
  const Op op{};
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  // every warp folds the per-warp partials itself: all threads get the block's total
  v = (threadIdx.x & 31) < (blockDim.x >> 5) ? red[threadIdx.x & 31] : init;
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();  // every warp has read red[] before it is reused
  return v;
}
"""


@dataclass(frozen=True)
class Rows:
    """rows x n elements; element j of row r at (r / inner) * n * inner + r % inner +
    j * inner (inner = 1: contiguous rows)."""

    rows: int
    n: int
    inner: int
    axis: int | None  # the output axis j runs along, when it is one axis

    @classmethod
    def from_compute(cls, c: Compute) -> "Rows":
        if c.op == "reduce":  # rows of the input's last axis, one value out per row
            shape = c.inputs[0].shape
            return cls(c.inputs[0].numel // shape[-1], shape[-1], 1, None)
        shape = c.output.shape
        if c.op == "softmax":
            d = c.attr("dim") % len(shape)
            inner = math.prod(shape[d + 1:])
            return cls(c.output.numel // shape[d], shape[d], inner, d)
        norm = tuple(c.attr("normalized_shape"))
        if tuple(shape[len(shape) - len(norm):]) != norm:
            raise CudaLoweringError(f"normalized shape {norm} is not the tail of {shape}")
        n = math.prod(norm)
        return cls(c.output.numel // n, n, 1, len(shape) - 1 if len(norm) == 1 else None)

    def base(self) -> str:
        if self.inner == 1:
            return f"blockIdx.x * {self.n}"
        return f"blockIdx.x / {self.inner} * {self.n * self.inner} + blockIdx.x % {self.inner}"


def row_reason(c: Compute) -> str | None:
    if c.op == "layer_norm" and len(c.inputs) != 3:
        return "layer norm without both weight and bias"
    try:
        Rows.from_compute(c)
    except CudaLoweringError as exc:
        return str(exc)
    return None


def _vecs(n: int, contiguous: bool) -> tuple[int, ...]:
    return tuple(v for v in (1, 2, 4) if n % v == 0 and (v == 1 or contiguous))


def row_space(rows: Rows) -> Space:
    combos = []
    for vec in _vecs(rows.n, rows.inner == 1):
        top = max(32, min(1024, 1 << (math.ceil(rows.n / vec) - 1).bit_length()))
        combos += [(t, vec) for t in (32, 64, 128, 256, 512, 1024) if t <= top]
    return Space(("threads", "vec"), tuple(combos), ())


def _row_loop(rows: Rows, cfg: Config, body) -> list[str]:
    """A thread's walk over its elements of the row; body(values, j) -> lines, where
    values are C expressions of the `vec` consecutive elements starting at j."""
    t, v = cfg["threads"], cfg["vec"]
    if v == 1:
        return [f"for (int j = threadIdx.x; j < {rows.n}; j += {t}) {{",
                f"const float x0 = xr[j * {rows.inner}];"] + body(["x0"], "j") + ["}"]
    return [f"for (int j = threadIdx.x * {v}; j < {rows.n}; j += {t * v}) {{",
            f"const float{v} xv = *reinterpret_cast<const float{v}*>(xr + j);"] + \
        body([f"xv.{_LANES[q]}" for q in range(v)], "j") + ["}"]


def _reduce(rows: Rows, cfg: Config, var: str, op: str, term) -> list[str]:
    """`var` = the block-wide reduction (sum or max) of term(x) over the row."""
    init = flit(float("-inf")) if op == "max" else "0.0f"
    fold = (lambda x: f"{var} = fmaxf({var}, {term(x)});") if op == "max" else \
        (lambda x: f"{var} += {term(x)};")
    loop = _row_loop(rows, cfg, lambda xs, j: [fold(x) for x in xs])
    return [f"float {var} = {init};"] + loop + \
        [f"{var} = rk_block_reduce<rk_{op}>({var}, red, {init});"]


def _write(compute: Compute, rows: Rows, cfg: Config, value) -> list[str]:
    """The final pass: value(x, j) per element, the epilogue, the store."""
    v = cfg["vec"]

    def body(xs, j):
        lines = []
        for q, x in enumerate(xs):
            jq = f"{j} + {q}" if q else j
            o = f"o{q}"
            coords = {rows.axis: f"({jq})"} if rows.axis is not None else {}
            epi = epilogue_lines(compute, f"v{q}", operand_reads(compute, o, coords))
            if q == 0 or uses(o, epi):
                lines.append(f"const int {o} = base + ({jq}) * {rows.inner};")
            lines += [f"float v{q} = {value(x, jq)};"] + epi
        if v == 1:
            return lines + ["out[o0] = v0;"]
        vals = ", ".join(f"v{q}" for q in range(v))
        return lines + [f"*reinterpret_cast<float{v}*>(out + o0) = make_float{v}({vals});"]
    return _row_loop(rows, cfg, body)


def _reduction(compute: Compute, rows: Rows, cfg: Config) -> list[str]:
    """The block's reduction of its row, its epilogue and store by thread 0; min is the
    max of the negated row, negated."""
    kind = compute.attr("kind")
    sign = "-" if kind == "min" else ""
    lines = _reduce(rows, cfg, "acc", "max" if kind in ("max", "min") else "sum",
                    lambda x: f"{sign}{x}")
    value = {"sum": "acc", "mean": f"acc / {float(rows.n)}f", "max": "acc", "min": "-acc"}
    epi = epilogue_lines(compute, "v0", operand_reads(compute, "o0", {}))
    return lines + ["if (threadIdx.x == 0) {", "const int o0 = blockIdx.x;",
                    f"float v0 = {value[kind]};", *epi, "out[o0] = v0;", "}"]


def render_rows(compute: Compute, rows: Rows, cfg: Config) -> CudaKernel:
    body = ["__shared__ float red[32];", f"const int base = {rows.base()};",
            "const float* xr = in0 + base;"]
    if compute.op == "softmax":
        body += _reduce(rows, cfg, "mx", "max", lambda x: x)
        body += _reduce(rows, cfg, "sm", "sum", lambda x: f"expf({x} - mx)")
        body += ["const float inv = 1.0f / sm;"]
        body += _write(compute, rows, cfg, lambda x, j: f"expf({x} - mx) * inv")
    elif compute.op == "reduce":
        body += _reduction(compute, rows, cfg)
    else:
        eps = flit(compute.attr("eps"))
        body += _reduce(rows, cfg, "s1", "sum", lambda x: x)
        body += [f"const float mean = s1 / {float(rows.n)}f;"]
        body += _reduce(rows, cfg, "s2", "sum", lambda x: f"({x} - mean) * ({x} - mean)")
        body += [f"const float rstd = 1.0f / sqrtf(s2 / {float(rows.n)}f + {eps});"]
        body += _write(compute, rows, cfg,
                       lambda x, j: f"({x} - mean) * rstd * in1[{j}] + in2[{j}]")
    threads = cfg["threads"]
    source = kernel_source(compute, threads, body, REDUCE_HELPERS)
    grid = check_grid((rows.rows, 1, 1), compute.describe())
    return CudaKernel(kernel_name(compute), source, grid, (threads, 1, 1), 0,
                      buffers_of(compute))


def elementwise_space(c: Compute) -> Space:
    combos = tuple((t, v, i) for v in _vecs(c.output.numel, True)
                   for t in (64, 128, 256, 512) for i in (1, 2, 4))
    return Space(("threads", "vec", "items"), combos, ())


def render_elementwise(compute: Compute, cfg: Config) -> CudaKernel:
    t, v, items = cfg["threads"], cfg["vec"], cfg["items"]
    nvec = compute.output.numel // v
    out_shape = compute.output.shape
    full = [is_full(op, s, out_shape) for op, s in operand_specs(compute)]
    body = [f"const int q0 = blockIdx.x * {t * items} + threadIdx.x;", "#pragma unroll",
            f"for (int it = 0; it < {items}; ++it) {{", f"const int q = q0 + it * {t};",
            f"if (q < {nvec}) {{", f"const int o = q * {v};"]
    vt = "float" if v == 1 else f"float{v}"
    body.append(f"const {vt} xv = *reinterpret_cast<const {vt}*>(in0 + o);")
    body += [f"const {vt} ev{i} = *reinterpret_cast<const {vt}*>(e{i} + o);"
             for i, f in enumerate(full) if f]
    for q in range(v):
        lane = "" if v == 1 else f".{_LANES[q]}"
        oq = f"o + {q}" if q else "o"
        reads = operand_reads(compute, oq, {})
        reads = [f"ev{i}{lane}" if f else r for i, (f, r) in enumerate(zip(full, reads))]
        body += [f"float v{q} = xv{lane};"] + epilogue_lines(compute, f"v{q}", reads)
    vals = ", ".join(f"v{q}" for q in range(v))
    body.append("out[o] = v0;" if v == 1 else
                f"*reinterpret_cast<float{v}*>(out + o) = make_float{v}({vals});")
    body += ["}", "}"]
    source = kernel_source(compute, t, body)
    grid = check_grid((math.ceil(nvec / (t * items)), 1, 1), compute.describe())
    return CudaKernel(kernel_name(compute), source, grid, (t, 1, 1), 0, buffers_of(compute))
