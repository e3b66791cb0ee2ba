"""A rendered CUDA kernel as plain data: source, launch geometry and buffers.

Buffers come in reference operand order: the anchor's inputs `in0..`, then each epilogue
operand `e0..`, then the kernel's own scratch buffers if it has any (a split-K GEMM's
partial sums and tile counters: zeroed once, left as the kernel found them), then `out`;
every kernel takes only pointers (every shape is a
compile-time constant in its source). A buffer holds torch's contiguous layout of its
tensor, or its NHWC permutation where the config's `layout` says so
(cuda/render.operand_layouts, cuda_pack and cuda_unpack are the host side).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from raytune_kernels.task import Compute
from raytune_kernels.cuda.epilogue import CudaLoweringError, operand_specs

MAX_INDEX = 2**31 - 1  # kernels index with 32-bit ints
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class CudaBuffer:
    name: str
    size: int  # float32 elements
    role: str  # "in", "scratch" or "out"


@dataclass(frozen=True)
class CudaKernel:
    """CUDA C source with one `extern "C" __global__` kernel, and how to launch it."""

    name: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int  # dynamic shared memory at launch (static shared memory is in source)
    buffers: tuple[CudaBuffer, ...]

    @property
    def threads(self) -> int:
        return math.prod(self.block)


def kernel_name(compute: Compute) -> str:
    return f"k_{compute.key()}"


def buffers_of(compute: Compute, scratch: tuple[tuple[str, int], ...] = ()
               ) -> tuple[CudaBuffer, ...]:
    """The kernel's buffers in launch order (= reference operand order, then the
    (name, floats) scratch buffers, then out)."""
    bufs = [CudaBuffer(f"in{i}", s.numel, "in") for i, s in enumerate(compute.inputs)]
    bufs += [CudaBuffer(f"e{i}", s.numel, "in") for i, (_, s) in
             enumerate(operand_specs(compute))]
    bufs += [CudaBuffer(name, size, "scratch") for name, size in scratch]
    bufs.append(CudaBuffer("out", compute.output.numel, "out"))
    for b in bufs:
        if b.size > MAX_INDEX:
            raise CudaLoweringError(f"buffer {b.name} has {b.size} elements; CUDA kernels "
                                    "index with 32-bit ints")
    return tuple(bufs)


def signature(compute: Compute, threads: int, buffers: tuple[CudaBuffer, ...] = ()) -> str:
    """`extern "C"` kernel header taking every buffer (buffers_of(compute) unless given),
    inputs const and restrict."""
    params = [f"const float* __restrict__ {b.name}" if b.role == "in"
              else f"float* __restrict__ {b.name}" for b in buffers or buffers_of(compute)]
    # min blocks 1: registers are capped only by what one block of `threads` needs (a cap
    # without it made ptxas spill at 80 of 255 allowed registers, measured on sm_80/sm_90)
    return (f'extern "C" __global__ void __launch_bounds__({threads}, 1)\n'
            f"{kernel_name(compute)}({', '.join(params)})")


def kernel_source(compute: Compute, threads: int, body: list[str],
                  prelude: str = "", buffers: tuple[CudaBuffer, ...] = ()) -> str:
    """The whole translation unit: helpers, the kernel header, the body indented by
    brace depth (so a failing kernel's source reads well in an error log)."""
    out, depth = [], 1
    for line in body:
        if line.startswith("}"):
            depth -= 1
        out.append("  " * depth + line)
        depth += line.count("{") - line.count("}") + (1 if line.startswith("}") else 0)
    return prelude + signature(compute, threads, buffers) + " {\n" + "\n".join(out) + "\n}\n"


def check_grid(grid: tuple[int, int, int], what: str) -> tuple[int, int, int]:
    if grid[0] > MAX_INDEX or max(grid[1:]) > MAX_GRID_YZ:
        raise CudaLoweringError(f"{what}: grid {grid} exceeds CUDA's limits")
    return grid
