"""Graph rewrites for inference: fold per-channel affine ops (batch norm) into conv/dense,
compose chains of permutes into one, and pad the channels of convs whose outputs do not
fill vectors."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from raytune_kernels.frontend.graph import BINARY_OPS, UNARY_OPS, Graph, Node
from raytune_kernels.frontend.slicing import encode_index


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


def compose_permutes(graph: Graph) -> Graph:
    """A permute whose input is another permute's output, read by nothing else, becomes
    one permute of that permute's input: one copy where there were two (attention's keys,
    split into heads and then transposed for Q K^T). A chain that composes to the identity
    is its input, unless it is a graph output."""
    users = graph.consumers()
    now: dict[str, Node] = {}  # name -> the node as rewritten so far
    dropped: set[str] = set()
    alias: dict[str, str] = {}  # a value dropped as the identity -> the value it equals
    out: list[Node] = []
    for n in graph.nodes:
        if any(i in alias for i in n.inputs):
            n = replace(n, inputs=tuple(alias.get(i, i) for i in n.inputs))
        first = now.get(n.inputs[0]) if n.op == "permute" and n.inputs else None
        if first is not None and first.op == "permute" and users.get(first.name) == [n.name]:
            dims = tuple(first.attr("dims")[d] for d in n.attr("dims"))
            dropped.add(first.name)
            if dims == tuple(range(len(dims))) and n.name not in graph.outputs:
                alias[n.name] = first.inputs[0]
                continue
            n = replace(n, inputs=first.inputs,
                        attrs=tuple((k, dims if k == "dims" else v) for k, v in n.attrs))
        now[n.name] = n
        out.append(n)
    if not dropped:
        return graph
    kept = tuple(n for n in out if n.name not in dropped)
    return Graph(graph.inputs, kept, graph.outputs, dict(graph.params))


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


VECTOR = 8  # channels a conv's output must come in multiples of to have a kernel of ours
# ops that keep the channel axis (dim 1) of their input, channel by channel
_PER_CHANNEL = frozenset({"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"})


@dataclass(frozen=True)
class _Padded:
    real: int  # channels that are the model's
    width: int  # channels stored, a multiple of VECTOR
    fill: float  # the value every padding channel holds


def pad_channels(graph: Graph) -> Graph:
    """Give convs whose output channels do not fill 8-float vectors (ShuffleNet's 58 and
    116) zero channels up to the next multiple, so they have kernels of ours.

    The padded value flows on through what treats channels one by one (elementwise ops
    with a scalar or another value padded alike, per-channel affines, pools, a depthwise
    conv, which pads its weights too) and into the convs that read it, whose weights get
    zero input columns for the padding; any other reader (glue, an operand of another
    shape, an island, the output) reads a slice of the real channels. Every padding
    channel holds one known value (the epilogue applied to 0.0), followed op by op at
    capture; where it would stop being finite (1/x, rsqrt of 0) the value is sliced
    instead, so zero weights never meet an inf or a NaN and no result changes."""
    params = dict(graph.params)
    padded: dict[str, _Padded] = {}
    taken = {n.name for n in graph.nodes} | set(params) | {name for name, _ in graph.inputs}
    out: list[Node] = []

    def real(value: str, layer: str) -> str:
        """`value` as a reader that cannot take padding reads it: its real channels."""
        if value not in padded:
            return value
        shape = list(graph.shape_of(value))
        name = _fresh(f"{value}_real", taken)
        index = encode_index((slice(None), slice(0, shape[1])))
        out.append(Node(name, "index", (value,), (("index", index),), tuple(shape), layer))
        return name

    for n in graph.nodes:
        grown = None
        if n.op == "conv2d" and n.inputs[0] not in padded and _ragged_depthwise(n, params):
            n = replace(n, inputs=(_zero_channels(n, graph, padded, taken, out),)
                        + n.inputs[1:])
        if n.op == "conv2d":
            grown = _pad_conv(n, params, padded, taken)
        elif n.inputs and n.inputs[0] in padded:
            grown = _follow(n, params, padded, taken)
        if grown is None:
            grown = replace(n, inputs=tuple(real(v, n.layer) for v in n.inputs))
        out.append(grown)
    outputs = tuple(real(v, "output") for v in graph.outputs)
    return Graph(graph.inputs, tuple(out), outputs, params)


def _ragged_depthwise(n: Node, params: dict) -> bool:
    w, groups = params.get(n.inputs[1]), n.attr("groups")
    return w is not None and groups > 1 and groups == w.shape[0] and w.shape[1] == 1 \
        and groups % VECTOR != 0


def _zero_channels(n: Node, graph: Graph, padded: dict, taken: set, out: list) -> str:
    """The depthwise conv's input with zero channels appended (a glue pad), so the conv
    is one of padded channels."""
    x = n.inputs[0]
    shape = list(graph.shape_of(x))
    real, width = shape[1], -(-shape[1] // VECTOR) * VECTOR
    shape[1] = width
    name = _fresh(f"{x}_padded", taken)
    pad = (0, 0, 0, 0, 0, width - real)
    out.append(Node(name, "pad", (x,), (("mode", "constant"), ("pad", pad), ("value", 0.0)),
                    tuple(shape), n.layer))
    padded[name] = _Padded(real, width, 0.0)
    return name


def _fresh(hint: str, taken: set) -> str:
    name, i = hint, 1
    while name in taken:
        name, i = f"{hint}_{i}", i + 1
    taken.add(name)
    return name


def _grow(t: torch.Tensor, size: int, axis: int = 0) -> torch.Tensor:
    """`t` with zeros appended along `axis` up to `size`."""
    shape = list(t.shape)
    shape[axis] = size
    full = torch.zeros(shape)
    full.narrow(axis, 0, t.shape[axis]).copy_(t)
    return full.contiguous()


def _param(params: dict, taken: set, old: str, value: torch.Tensor) -> str:
    name = _fresh(f"{old}.padded", taken)
    params[name] = value
    return name


def _pad_conv(n: Node, params: dict, padded: dict, taken: set) -> Node | None:
    """The conv reading padded channels (zero weight columns for them) or writing its
    output padded; None where it is left as it is (its input, if padded, is sliced)."""
    w = params.get(n.inputs[1])
    x, groups = n.inputs[0], n.attr("groups")
    if w is None:
        return None
    depthwise = groups > 1 and groups == w.shape[0] and w.shape[1] == 1
    if groups > 1 and not (depthwise and x in padded):
        return None  # grouped: the pass keeps to ungrouped and padded depthwise convs
    k = w.shape[0]
    if depthwise:  # channel by channel: it carries the padding on
        width = padded[x].width
    else:
        width = -(-k // VECTOR) * VECTOR
        if x in padded:
            w = _grow(w, padded[x].width, axis=1)  # zero weights for padding channels
        elif width == k:
            return None
    inputs = [x, _param(params, taken, n.inputs[1], _grow(w, width))]
    if len(n.inputs) > 2:
        inputs.append(_param(params, taken, n.inputs[2], _grow(params[n.inputs[2]], width)))
    attrs = dict(n.attrs, groups=width) if depthwise else dict(n.attrs)
    shape = (n.shape[0], width) + tuple(n.shape[2:])
    if width > k:
        padded[n.name] = _Padded(k, width, 0.0)  # zero weights, zero bias
    return replace(n, inputs=tuple(inputs), attrs=tuple(sorted(attrs.items())), shape=shape)


def _follow(n: Node, params: dict, padded: dict, taken: set) -> Node | None:
    """`n` on its padded input, its output padded alike; None where it cannot take the
    padding (it mixes channels, reads an operand of another shape, or would make the
    padding channels inf or NaN)."""
    from raytune_kernels.frontend.reference import BINARY_FNS, UNARY_FNS

    first = padded[n.inputs[0]]
    inputs = list(n.inputs)
    fill = torch.tensor(first.fill)
    if n.op in UNARY_OPS and len(inputs) == 1:
        fill = UNARY_FNS[n.op](fill)
    elif n.op in _PER_CHANNEL and len(inputs) == 1:
        pass  # pooling a constant channel gives that constant (zero padding averages in 0)
    elif n.op in BINARY_OPS:
        if len(inputs) == 1:
            other = torch.tensor(n.attr("scalar"))
        elif all(padded.get(v) is not None and padded[v].real == first.real
                 and padded[v].width == first.width for v in inputs):
            other = torch.tensor(padded[inputs[1]].fill)
        else:
            return None
        fn = BINARY_FNS[n.op]
        fill = fn(other, fill) if n.attr("reverse") else fn(fill, other)
    elif n.op == "affine" and n.attr("axis") == 1 and all(v in params for v in inputs[1:]):
        for i in (1, 2):  # scale and shift 0 on the padding: it becomes 0
            inputs[i] = _param(params, taken, inputs[i], _grow(params[inputs[i]],
                                                                first.width))
        fill = torch.tensor(0.0)
    else:
        return None
    if n.op in _PER_CHANNEL and n.op == "avg_pool2d" and first.fill != 0.0 \
            and n.attr("padding") != (0, 0):
        return None  # zero padding averaged with a nonzero fill: not one value
    if not bool(torch.isfinite(fill)):
        return None
    padded[n.name] = _Padded(first.real, first.width, float(fill))
    shape = (n.shape[0], first.width) + tuple(n.shape[2:])
    return replace(n, inputs=tuple(inputs), shape=shape)
