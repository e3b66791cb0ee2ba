"""The PyTorch steps of a compiled network as plain values: each callable is a frozen
dataclass of what it needs (a compute, a graph node, a shape), not a closure, so that a
network's plan pickles into a saved file (compile/artifact.py) and runs the same when
loaded."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from raytune_kernels.frontend.graph import Node
from raytune_kernels.frontend.partition import run_glue
from raytune_kernels.frontend.reference import reference
from raytune_kernels.task import Compute


@dataclass(frozen=True)
class Reference:
    """PyTorch's kernel for a task (fallback="torch")."""

    compute: Compute

    def __call__(self, *xs: torch.Tensor) -> torch.Tensor:
        return reference(self.compute, *xs)


@dataclass(frozen=True)
class Glue:
    """A data-movement node (or a PyTorch island) run on its input values."""

    node: Node

    def __call__(self, *xs: torch.Tensor) -> torch.Tensor:
        return run_glue(self.node, dict(zip(self.node.inputs, xs)))


@dataclass(frozen=True)
class ConcatInto:
    """torch.cat written straight into the output buffer."""

    dim: int

    def __call__(self, out: torch.Tensor, *xs: torch.Tensor) -> None:
        torch.cat(xs, self.dim, out=out)


@dataclass(frozen=True)
class EmbeddingInto:
    """An embedding's rows gathered straight into the output buffer: no temporary of the
    output's size (a fresh allocation, its pages faulted in on every call, then a copy).
    The ids arrive as float32 (exact below 2**24)."""

    def __call__(self, out: torch.Tensor, ids: torch.Tensor, table: torch.Tensor) -> None:
        torch.index_select(table, 0, ids.reshape(-1).long(),
                           out=out.view(-1, table.shape[-1]))


@dataclass(frozen=True)
class Narrow:
    """The first n columns of each of `rows` rows, as `shape` (a dense whose N the kernel
    padded to its vector block)."""

    rows: int
    n: int
    shape: tuple[int, ...]

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.rows, -1)[:, :self.n].reshape(self.shape)
