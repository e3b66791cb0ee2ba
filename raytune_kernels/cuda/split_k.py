"""Split-K, shared by the FFMA (cuda/gemm.py) and tensor-core (cuda/mma.py) GEMM kernels.

A batch-1 network's late layers are GEMMs of a few output tiles and a long reduction: one
block per tile leaves most SMs idle while each block walks the whole reduction. With
`split` > 1 the reduction is cut into `split` ranges of whole slices, one block each
(grid z = batch x split). Each block stores its partial tile to a scratch workspace; the
last block of a tile to arrive (a counter per tile, atomicAdd after a fence) adds the
partials, its own among them, in range order, so the sum does not depend on which block
came last. It then applies the epilogue, stores the tile and resets the counter for the
next launch. The workspace and counters are scratch buffers (cuda/kernel.py): zeroed once,
left as the kernel found them.

A thread's partial tile is its whole accumulator array, laid out in the workspace as the
array is, after those of the threads before it; how the accumulators map to output
elements is the kernel's own business, since the block that finishes the tile has the same
threads holding the same elements.
"""
from __future__ import annotations

import math

from raytune_kernels.cuda.epilogue import uses
from raytune_kernels.space import Config

SPLITS = (2, 4, 8, 16, 32)
MAX_WORKSPACE = 1 << 22  # floats of partial sums (16 MiB)
# blocks of a split grid: past this every GPU is full several times over, and a split only
# adds partial sums to write and add
MAX_SPLIT_BLOCKS = 1024


def tiles(view, bm: int, bn: int) -> int:
    """Output tiles of a block tile, over the batch."""
    return view.batch * math.ceil(view.m / bm) * math.ceil(view.n / bn)


def splits(view, bm: int, bn: int, bk: int) -> tuple[int, ...]:
    """Split factors of a tiling: 1, and each of SPLITS that gives every range at least
    two slices of bk, keeps the grid within MAX_SPLIT_BLOCKS and the workspace within
    MAX_WORKSPACE."""
    slices, n = math.ceil(view.k / bk), tiles(view, bm, bn)
    return (1,) + tuple(s for s in SPLITS if slices >= 2 * s and n * s <= MAX_SPLIT_BLOCKS
                        and n * s * bm * bn <= MAX_WORKSPACE)


def scratch(view, bm: int, bn: int, split: int) -> tuple[tuple[str, int], ...]:
    """(name, floats) of the scratch buffers: the partial tiles and the per-tile counters;
    none without a split."""
    if split == 1:
        return ()
    n = tiles(view, bm, bn)
    return (("ws", n * split * bm * bn), ("cnt", n))


def config_split(cfg: Config) -> int:
    """A GEMM config's split factor (1 where the config predates the knob)."""
    return cfg.get("split", 1)


def block_index(split: int, prologue: list[str]) -> list[str]:
    """The view's prologue, after the batch index z where it reads it, and with a split,
    sk, the block's range of the reduction (both from blockIdx.z)."""
    z = "blockIdx.z" if split == 1 else f"blockIdx.z / {split}"
    lines = [f"const int z = {z};"] * uses("z", prologue)
    return lines + [f"const int sk = blockIdx.z % {split};"] * (split > 1) + prologue


def k_range(split: int, slices: int) -> str:
    """The declaration of this block's range of slices, from kbeg, nk of them (every range
    non-empty: slices >= split)."""
    if split == 1:
        return f"const int kbeg = 0, nk = {slices};"
    return (f"const int kbeg = sk * {slices} / {split}, "
            f"nk = (sk + 1) * {slices} / {split} - kbeg;")


def meet(split: int, tile: int, dims: tuple[int, ...], acc: str = "acc") -> list[str]:
    """The meeting point after the reduction: this block's partials (the thread's `acc`
    array of shape `dims`) to the workspace, then only the last block of the tile goes
    on, with the sum of all in `acc`. Needs `tid` and `sk` in scope."""
    per = math.prod(dims)
    names = [f"u{d}" for d in range(len(dims))]
    flat = names[0]
    for name, extent in zip(names[1:], dims[1:]):
        flat = f"({flat}) * {extent} + {name}"
    at = f"ws + (tile * {split} + p) * {tile} + tid * {per} + {flat}"
    elem = acc + "".join(f"[{n}]" for n in names)
    loops = []
    for name, extent in zip(names, dims):
        loops += ["#pragma unroll", f"for (int {name} = 0; {name} < {extent}; ++{name})"]
    return (["__shared__ unsigned last;",
             f"const int tile = (blockIdx.z / {split} * gridDim.y + blockIdx.y) * gridDim.x "
             "+ blockIdx.x;", "{", "const int p = sk;", *loops, "{",
             f"*({at}) = {elem};", "}", "}",
             "__threadfence();", "__syncthreads();",
             "unsigned* counter = reinterpret_cast<unsigned*>(cnt) + tile;",
             f"if (tid == 0) last = atomicAdd(counter, 1u) == {split - 1}u;",
             "__syncthreads();", "if (!last) return;", "if (tid == 0) *counter = 0u;",
             "__threadfence();",
             # every partial, its own too, read back one range at a time (a loop left
             # rolled: the whole sum unrolled kept 8 ranges of loads live and spilled)
             "#pragma unroll 1", f"for (int p = 0; p < {split}; ++p) {{"] + loops +
            ["{", f"const float v = __ldcg({at});", f"{elem} = p ? {elem} + v : v;",
             "}", "}"])
