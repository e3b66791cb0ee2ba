"""Cut a Graph into fused task instances and deduplicate them into weighted Tasks.

Every anchor op starts a task; each elementwise op that follows is fused into the epilogue
of the task whose output it reads, when that output has no other reader and the op does not
broadcast it to a bigger shape. With two fusable operands (a residual add of two convs), the
op joins the task produced last, so its other operand is ready when the fused kernel runs.
An elementwise op that cannot be fused starts an `elementwise` task of its own. Data
movement (reshape, permute, concat) runs between tasks as glue.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from raytune_kernels.errors import CompileError, UnsupportedOpError
from raytune_kernels.frontend.graph import ANCHOR_OPS, ELEMENTWISE_OPS, GLUE_OPS, Graph, Node
from raytune_kernels.frontend.integers import COMPARE_FNS
from raytune_kernels.frontend.slicing import decode_index
from raytune_kernels.frontend.reference import reference
from raytune_kernels.task import Compute, EpilogueOp, Task, TensorSpec


@dataclass(frozen=True)
class TaskStep:
    """One fused kernel call: the task it instantiates and the values it binds."""

    key: str
    layer: str
    nodes: tuple[str, ...]
    args: tuple[str, ...]
    output: str


@dataclass(frozen=True)
class GlueStep:
    node: str


@dataclass
class Partition:
    """A graph cut into steps (in execution order) and the deduplicated tasks they use."""

    graph: Graph
    steps: tuple[TaskStep | GlueStep, ...]
    tasks: tuple[Task, ...]

    def task(self, key: str) -> Task:
        return next(t for t in self.tasks if t.key == key)


@dataclass
class _Group:
    anchor: Node
    op: str
    inputs: list[str]
    attrs: tuple
    epilogue: list[EpilogueOp] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    tail: str = ""


class _Cutter:
    def __init__(self, graph: Graph):
        self.graph, self.users = graph, graph.consumers()
        self.shape = graph.shapes
        self.position = {n.name: i for i, n in enumerate(graph.nodes)}
        self.groups: list[_Group] = []
        self.glue: list[GlueStep] = []
        self.owner: dict[str, _Group] = {}  # open tail value -> its group

    def spec(self, value: str) -> TensorSpec:
        return TensorSpec(self.shape[value])

    def run(self) -> None:
        for n in self.graph.nodes:
            if n.op in ANCHOR_OPS:
                self._anchor(n)
            elif n.op in ELEMENTWISE_OPS:
                self._elementwise(n)
            elif n.op in GLUE_OPS:
                self.glue.append(GlueStep(n.name))
            else:
                raise UnsupportedOpError(n.op, n.layer, "no task kind for this graph op")

    def _open(self, g: _Group, n: Node) -> None:
        g.nodes.append(n.name)
        self.owner.pop(g.tail, None)
        g.tail = n.name
        self.owner[n.name] = g

    def _anchor(self, n: Node) -> None:
        ins, bias = list(n.inputs), None
        if n.op in ("conv2d", "dense") and len(ins) == 3:
            ins, bias = ins[:2], ins[2]
        g = _Group(n, n.op, ins, n.attrs, args=list(ins))
        if bias is not None:
            axis = 1 if n.op == "conv2d" else len(n.shape) - 1
            g.epilogue.append(EpilogueOp("bias", (self.spec(bias),), axis=axis))
            g.args.append(bias)
        self.groups.append(g)
        self._open(g, n)

    def _fusable(self, n: Node) -> _Group | None:
        best = None
        for v in n.inputs:
            g = self.owner.get(v)
            if g is None or self.users.get(v) != [n.name] or self.shape[v] != n.shape:
                continue
            if best is None or self.position[v] > self.position[best.tail]:
                best = g
        return best

    def _elementwise(self, n: Node) -> None:
        g = self._fusable(n)
        if g is None:
            primary = next((v for v in n.inputs if self.shape[v] == n.shape
                            and v not in self.graph.params), None)
            if primary is None:
                raise UnsupportedOpError(n.op, n.layer,
                                         "an elementwise op that broadcasts every operand")
            g = _Group(n, "elementwise", [primary], (), args=[primary])
            self.groups.append(g)
            acc = primary
        else:
            acc = g.tail
        self._append_epilogue(g, n, acc)
        self._open(g, n)

    def _append_epilogue(self, g: _Group, n: Node, acc: str) -> None:
        others = list(n.inputs)
        others.remove(acc)  # the accumulator; what is left are the op's other operands
        if n.op == "affine":
            g.epilogue.append(EpilogueOp("affine", tuple(self.spec(v) for v in others),
                                         axis=n.attr("axis")))
        elif n.attr("scalar") is not None:
            g.epilogue.append(EpilogueOp(n.op, scalar=n.attr("scalar"),
                                         reverse=bool(n.attr("reverse"))))
        elif others:
            reverse = n.inputs[0] != acc and n.op in _ORDERED
            g.epilogue.append(EpilogueOp(n.op, (self.spec(others[0]),), reverse=reverse))
        else:
            g.epilogue.append(EpilogueOp(n.op))
        g.args.extend(others)

    def compute(self, g: _Group) -> Compute:
        return Compute(g.op, tuple(self.spec(v) for v in g.inputs), self.spec(g.tail),
                       g.attrs, tuple(g.epilogue))


# binary ops whose operands do not commute: with the accumulator second, reversed
_ORDERED = ("sub", "div", "prelu", "elu")


def partition(graph: Graph) -> Partition:
    """Cut `graph` into task steps and glue steps, in an order that respects data flow."""
    cut = _Cutter(graph)
    cut.run()
    tasks: dict[str, list] = {}
    steps: list[tuple[int, TaskStep | GlueStep]] = []
    for g in cut.groups:
        compute = cut.compute(g)
        key = compute.key()
        entry = tasks.setdefault(key, [compute, 0, []])
        entry[1] += 1
        entry[2].append(g.anchor.layer if g.op != "elementwise" else g.anchor.name)
        step = TaskStep(key, entry[2][-1], tuple(g.nodes), tuple(g.args), g.tail)
        steps.append((cut.position[g.tail], step))
    steps += [(cut.position[s.node], s) for s in cut.glue]
    steps.sort(key=lambda p: p[0])
    out = tuple(Task(k, c, w, tuple(layers)) for k, (c, w, layers) in tasks.items())
    return Partition(graph, tuple(s for _, s in steps), out)


def execute(part: Partition, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run the partitioned graph step by step through the tasks' reference implementations."""
    env = run_steps(part, inputs)
    return [env[v] for v in part.graph.outputs]


def run_steps(part: Partition, inputs: Sequence[torch.Tensor],
              after: Callable[[str], object] | None = None) -> dict[str, torch.Tensor]:
    """Every value of the graph, computed step by step by the references; `after(name)`
    runs after each step (its layer for a task, its node for glue), e.g. to clock it."""
    graph = part.graph
    if any(p.is_meta for p in graph.params.values()):
        raise CompileError("the graph's own weights are not here (a network loaded from a "
                           "file holds its packed weights only): compare against the model "
                           "by compiling it with compile_network")
    env: dict[str, torch.Tensor] = dict(graph.params)
    env.update({name: x for (name, _), x in zip(graph.inputs, inputs)})
    nodes = graph.node_map()
    computes = {t.key: t.compute for t in part.tasks}
    with torch.no_grad():
        for step in part.steps:
            if isinstance(step, TaskStep):
                env[step.output] = reference(computes[step.key], *(env[a] for a in step.args))
                name = step.layer
            else:
                env[step.node] = run_glue(nodes[step.node], env)
                name = step.node
            if after is not None:
                after(name)
    return env


def run_glue(n: Node, env: dict[str, torch.Tensor]) -> torch.Tensor:
    if n.op == "reshape":
        return env[n.inputs[0]].reshape(n.attr("shape"))
    if n.op == "permute":
        return env[n.inputs[0]].permute(n.attr("dims"))
    if n.op == "concat":
        return torch.cat([env[v] for v in n.inputs], n.attr("dim"))
    if n.op == "index":  # indexing and slicing (frontend/slicing.py getitem_handler)
        computed = tuple(env[v] for v in n.inputs[1:])
        return env[n.inputs[0]][decode_index(n.attr("index"), computed)]
    if n.op == "pad":
        return torch.nn.functional.pad(env[n.inputs[0]], n.attr("pad"), n.attr("mode"),
                                       n.attr("value"))
    if n.op == "roll":
        return torch.roll(env[n.inputs[0]], n.attr("shifts"), n.attr("dims"))
    if n.op == "expand":
        return env[n.inputs[0]].expand(n.attr("shape"))
    if n.op == "repeat":
        return env[n.inputs[0]].repeat(n.attr("repeats"))
    if n.op == "embedding":  # ids live in float32 buffers (exact below 2**24)
        return torch.nn.functional.embedding(env[n.inputs[0]].long(), env[n.inputs[1]])
    if n.op == "compare":  # ones where it holds, in float32 as every value
        other = env[n.inputs[1]] if len(n.inputs) > 1 else n.attr("scalar")
        return COMPARE_FNS[n.attr("kind")](env[n.inputs[0]], other).to(torch.float32)
    if n.op == "cumsum":
        return torch.cumsum(env[n.inputs[0]], n.attr("dim"), dtype=torch.float32)
    if n.op == "gather":
        return torch.gather(env[n.inputs[0]], n.attr("dim"), env[n.inputs[1]].long())
    if n.op == "argmax":
        return torch.argmax(env[n.inputs[0]], n.attr("dim"), n.attr("keepdim")).float()
    if n.op == "torch":  # a PyTorch island (frontend/island.py)
        return n.attr("fn")(*(env[v] for v in n.inputs))
    raise ValueError(f"'{n.op}' is not a glue op")
