"""A layout problem from a partitioned network.

Nodes are the task steps and the concatenations (layout-flexible); reshapes and permutes
read and write NCHW. A candidate of a node is (input layout, output layout, seconds).
Edges join a value's producer to each reader: a data input is compared with the reader's
input layout, an operand that is added in the epilogue (a residual) with its output
layout; the edge's matrix holds the transform times between layouts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from raytune_kernels.layout.problem import LayoutProblem

if TYPE_CHECKING:
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
Bordering = Callable[["TaskStep", "Candidate"], bool]  # writes its output into a bordered buffer
IN_PLACE = "+border"  # label suffix: a producer that can write its reader's border itself


def layout_problem(part: Partition, candidates: Candidates, transform: Transform,
                   bordering: Bordering | None = None
                   ) -> tuple[LayoutProblem, list[list[Candidate]]]:
    """The layout problem of a partitioned network. With `bordering`, a value that has one
    reader (and is no graph output) costs nothing to bring from its producer's layout to
    the same layout with a border, when that producer candidate can write into the
    bordered buffer itself (compile/cpu_plan.borders_wanted does so then)."""
    from raytune_kernels.frontend.partition import TaskStep

    graph, nodes = part.graph, part.graph.node_map()
    steps: dict[int, TaskStep] = {}
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
            steps[i] = step
            reads += _task_reads(part, step, i)
        else:
            node = nodes[step.node]
            names.append(node.name)
            flexible = node.op == "concat"
            cands.append(candidates(node) if flexible else [Candidate(NCHW, NCHW, 0.0)])
            producer[node.name] = i
            reads += [(v, i, "in") for v in node.inputs if v not in graph.params]
    edges, mats, srcs, dsts = [], [], [], []
    readers = {}
    for value, _, _ in reads:
        readers[value] = readers.get(value, 0) + 1
    for value, reader, port in reads:
        p = producer[value]
        shape = graph.shape_of(value)
        alone = bordering is not None and p in steps and readers[value] == 1 and \
            port == "in" and value not in graph.outputs
        outs = [c.out_layout + IN_PLACE if alone and bordering(steps[p], c) else c.out_layout
                for c in cands[p]]
        ins = [c.in_layout if port == "in" else c.out_layout for c in cands[reader]]
        a_labels, b_labels = list(dict.fromkeys(outs)), list(dict.fromkeys(ins))
        edges.append((p, reader))
        mats.append(tuple(tuple(_edge_cost(transform, shape, a, b) for b in b_labels)
                          for a in a_labels))
        srcs.append(tuple(a_labels.index(o) for o in outs))
        dsts.append(tuple(b_labels.index(i) for i in ins))
    costs = tuple(tuple(c.seconds for c in cs) for cs in cands)
    problem = LayoutProblem(tuple(names), costs, tuple(edges), tuple(mats), tuple(srcs),
                            tuple(dsts))
    return problem, cands


def _edge_cost(transform: Transform, shape, a: str, b: str) -> float:
    """Seconds to bring a value from label a to b; nothing when a's producer writes b's
    border itself (a ends in IN_PLACE and b is a's layout with a border)."""
    if a.endswith(IN_PLACE):
        a = a[: -len(IN_PLACE)]
        if b.partition("/")[0] == a and b != a:
            return 0.0
    return transform(shape, a, b)


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
