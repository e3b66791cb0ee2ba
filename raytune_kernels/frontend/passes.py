"""Graph rewrites for inference: fold per-channel affine ops (batch norm) into conv/dense."""
from __future__ import annotations

from dataclasses import replace

import torch

from raytune_kernels.frontend.graph import Graph, Node


def fold_affine(graph: Graph) -> Graph:
    """Fold `affine` nodes (captured batch norms) into the conv2d/dense that feeds them.

    Folding is done only where it is exact: the producer's output has no other reader and
    the affine's channel axis is the producer's output-channel axis.
    """
    users = graph.consumers()
    nodes = graph.node_map()
    params = dict(graph.params)
    out: list[Node] = []
    folded: dict[str, Node] = {}
    for n in graph.nodes:
        prod = nodes.get(n.inputs[0]) if n.op == "affine" else None
        if prod is not None and _foldable(prod, n, users):
            folded[prod.name] = _fold(prod, n, params)
            continue
        out.append(n)
    # the folded producer takes the affine's place (and name) in topological order
    rebuilt = [n for n in out if n.name not in folded]
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    rebuilt += list(folded.values())
    rebuilt.sort(key=lambda n: position[n.name])
    return Graph(graph.inputs, tuple(rebuilt), graph.outputs, params)


def _foldable(prod: Node, affine: Node, users: dict) -> bool:
    if prod.op not in ("conv2d", "dense") or len(users.get(prod.name, [])) != 1:
        return False
    if affine.attr("axis") != 1:
        return False
    return prod.op == "conv2d" or len(prod.shape) == 2


def _fold(prod: Node, affine: Node, params: dict[str, torch.Tensor]) -> Node:
    scale, shift = params[affine.inputs[1]], params[affine.inputs[2]]
    weight = params[prod.inputs[1]]
    bias = params[prod.inputs[2]] if len(prod.inputs) > 2 else torch.zeros_like(scale)
    view = (-1,) + (1,) * (weight.dim() - 1)
    w_name, b_name = f"{affine.name}.folded_weight", f"{affine.name}.folded_bias"
    params[w_name] = (weight * scale.reshape(view)).contiguous()
    params[b_name] = (bias * scale + shift).contiguous()
    return replace(prod, name=affine.name, inputs=(prod.inputs[0], w_name, b_name))


def prune_params(graph: Graph) -> Graph:
    """Drop nodes nothing reads (what a refused handler began, a value the model computes
    and ignores), then the parameters no node reads any more (pre-folding weights)."""
    live, kept = set(graph.outputs), []
    for n in reversed(graph.nodes):
        if n.name in live:
            kept.append(n)
            live.update(n.inputs)
    graph = Graph(graph.inputs, tuple(reversed(kept)), graph.outputs, graph.params)
    used = {v for n in graph.nodes for v in n.inputs} | set(graph.outputs)
    params = {k: v for k, v in graph.params.items() if k in used}
    return Graph(graph.inputs, graph.nodes, graph.outputs, params)
