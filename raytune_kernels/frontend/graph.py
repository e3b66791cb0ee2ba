"""A small graph IR with static shapes: what the frontend captures and the partitioner cuts.

Values are named: a value is a graph input, a parameter (a constant tensor held in
`Graph.params`) or the output of a node. Nodes are frozen; attributes are tuples of
(name, value) pairs so that nodes hash and print the same way everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from raytune_kernels.task import BINARY_OPS as BINARY_NAMES, UNARY_OPS as UNARY_NAMES

# Ops the partitioner treats as elementwise (fusable into the epilogue of an anchor).
UNARY_OPS = frozenset(UNARY_NAMES)
BINARY_OPS = frozenset(BINARY_NAMES)
ELEMENTWISE_OPS = UNARY_OPS | BINARY_OPS | {"affine"}
# Ops that anchor a task: the heavy op of a fused kernel.
ANCHOR_OPS = frozenset({
    "conv2d", "dense", "matmul", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "softmax", "layer_norm", "reduce",
})
# Data-movement ops: executed between tasks, never tuned as a task of their own; with them
# the integer glue of position ids (compare, cumsum, gather, argmax: frontend/integers.py).
# "torch" nodes are islands (frontend/island.py)
GLUE_OPS = frozenset({"reshape", "permute", "concat", "index", "pad", "roll", "expand",
                      "repeat", "embedding", "compare", "cumsum", "gather", "argmax",
                      "torch"})
ALL_OPS = ELEMENTWISE_OPS | ANCHOR_OPS | GLUE_OPS


@dataclass(frozen=True)
class Node:
    """One op of the captured network. `layer` is the module path it came from."""

    name: str
    op: str
    inputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...]
    shape: tuple[int, ...]
    layer: str

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)


@dataclass
class Graph:
    """A captured network: inputs, nodes in topological order, outputs, parameters."""

    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    params: dict[str, torch.Tensor] = field(default_factory=dict)

    def node_map(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def consumers(self) -> dict[str, list[str]]:
        """Value name -> names of nodes that read it (graph outputs count as a reader)."""
        users: dict[str, list[str]] = {}
        for n in self.nodes:
            for v in n.inputs:
                users.setdefault(v, []).append(n.name)
        for v in self.outputs:
            users.setdefault(v, []).append("<output>")
        return users

    @cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = dict(self.inputs)
        shapes.update({k: tuple(v.shape) for k, v in self.params.items()})
        shapes.update({n.name: n.shape for n in self.nodes})
        return shapes

    def shape_of(self, value: str) -> tuple[int, ...]:
        """Shape of a graph input, parameter or node output (graphs are not mutated)."""
        return self.shapes[value]

    def summary(self) -> str:
        lines = [f"inputs {list(self.inputs)}"]
        lines += [f"{n.name} = {n.op}({', '.join(n.inputs)}) {dict(n.attrs)} -> {n.shape}"
                  for n in self.nodes]
        lines.append(f"outputs {list(self.outputs)}")
        return "\n".join(lines)
