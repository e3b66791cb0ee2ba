"""A layout problem from a partitioned network.

Nodes are the task steps and the concatenations (layout-flexible); reshapes and permutes
read and write NCHW. A candidate of a node is (input layout, output layout, seconds).
Edges join a value's producer to each reader: a data input is compared with the reader's
input layout, an operand that is added in the epilogue (a residual) with its output
layout; the edge's matrix holds the transform times between layouts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from raytune_kernels.layout.problem import LayoutProblem
from raytune_kernels.frontend.partition import Partition, TaskStep

NCHW = "NCHW"


@dataclass(frozen=True)
class Candidate:
    """A way to run a node: the layout it reads, the layout it writes, its time, and what
    runs (a schedule config, or None for a fixed kernel); layouts are labels such as NCHW,
    NHWC, NCHW16c, or NCHW16c/p1x1 for an input read with a 1-pixel border."""

    in_layout: str
    out_layout: str
    seconds: float
    config: object = field(default=None, compare=False)


Candidates = Callable[[object], list[Candidate]]  # TaskStep or concat node -> candidates
Transform = Callable[[tuple[int, ...], str, str], float]  # shape, from, to -> seconds


def layout_problem(part: Partition, candidates: Candidates, transform: Transform
                   ) -> tuple[LayoutProblem, list[list[Candidate]]]:
    graph, nodes = part.graph, part.graph.node_map()
    names, cands, producer = [], [], {}
    for name, _ in graph.inputs:
        producer[name] = len(names)
        names.append(name)
        cands.append([Candidate(NCHW, NCHW, 0.0)])
    reads: list[tuple[str, int, str]] = []  # value, reader node, port ("in" / "out")
    for step in part.steps:
        i = len(names)
        if isinstance(step, TaskStep):
            names.append(step.output)
            cands.append(candidates(step))
            producer[step.output] = i
            reads += _task_reads(part, step, i)
        else:
            node = nodes[step.node]
            names.append(node.name)
            flexible = node.op == "concat"
            cands.append(candidates(node) if flexible else [Candidate(NCHW, NCHW, 0.0)])
            producer[node.name] = i
            reads += [(v, i, "in") for v in node.inputs if v not in graph.params]
    edges, mats, srcs, dsts = [], [], [], []
    for value, reader, port in reads:
        p = producer[value]
        shape = graph.shape_of(value)
        outs = [c.out_layout for c in cands[p]]
        ins = [c.in_layout if port == "in" else c.out_layout for c in cands[reader]]
        a_labels, b_labels = list(dict.fromkeys(outs)), list(dict.fromkeys(ins))
        edges.append((p, reader))
        mats.append(tuple(tuple(transform(shape, a, b) for b in b_labels) for a in a_labels))
        srcs.append(tuple(a_labels.index(o) for o in outs))
        dsts.append(tuple(b_labels.index(i) for i in ins))
    costs = tuple(tuple(c.seconds for c in cs) for cs in cands)
    problem = LayoutProblem(tuple(names), costs, tuple(edges), tuple(mats), tuple(srcs),
                            tuple(dsts))
    return problem, cands


def _task_reads(part: Partition, step: TaskStep, i: int) -> list[tuple[str, int, str]]:
    compute = part.task(step.key).compute
    params = part.graph.params
    n_in = len(compute.inputs)
    out = [(step.args[0], i, "in")] + [(v, i, "in") for v in step.args[1:n_in]
                                       if v not in params]
    for v in step.args[n_in:]:
        if v not in params and part.graph.shape_of(v) == compute.output.shape:
            out.append((v, i, "out"))  # a residual: read in the output's layout
        elif v not in params:
            out.append((v, i, "in"))
    return out
