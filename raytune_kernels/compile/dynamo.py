"""raytune_kernels as a torch.compile backend:

    torch.compile(model, backend="raytune_kernels",
                  options={"records": "r18.jsonl", "target": "llvm", "threads": 2})

TorchDynamo hands the backend each graph it captured (a graph break splits a function into
several) with example inputs; the backend compiles each with compile_network from the
records and returns a callable for it. Dynamo passes a module's parameters and buffers as
graph inputs: they are bound back into the graph as constants (bind_parameters), so weights
are packed once, as in compile_network, and the compiled callable takes the data inputs
alone. A graph that
compile_network refuses stays PyTorch's, with a warning naming why; an op it has no node
for runs as a PyTorch island inside ours, as in compile_network. Inference only: a call
that needs gradients runs the graph as PyTorch would.

Options: records, target, dynamo_guards, and any keyword of compile_network (threads,
fallback, layout, atol, graph, ...).

Guards. Dynamo checks its guards before every call, one or more per module attribute it
read (ResNet-18: ~1300); after a network has streamed its weights through the caches,
those checks miss in them (bench/deploy.py times the backend against compile_network's
network, with and without these guards). The weights of a graph we compiled are its own
constants, so the guards on the module's parameters and buffers (their metadata and the
dicts holding them) protect nothing it reads: the backend drops them (`lean_guards`;
`dynamo_guards=True` keeps them). Every other guard stays, so a module replaced, retyped
or switched to training is still recompiled; as in compile_network, a weight changed after
compiling is not seen: compile again. torch's own `"guard_filter_fn":
torch.compiler.skip_guard_on_all_nn_modules_unsafe` drops the module guards as well, for a
model whose modules never change, and `torch._dynamo.config.install_free_tensors = True`
(set before the first call) has Dynamo pass the data inputs alone instead of fetching every
weight for each call. What remains is Dynamo's own work per call, on objects the network's
run has evicted from the caches; with a function that touches nothing, it is far cheaper.

Registered under the name "raytune_kernels" through torch's `torch_dynamo_backends` entry
point (pyproject.toml) when the package is installed.
"""
from __future__ import annotations

import copy
import warnings
from typing import Callable, Sequence

import torch

from raytune_kernels.errors import RaytuneError


def bind_parameters(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]
                    ) -> tuple[torch.fx.GraphModule, list[int]]:
    """A copy of `gm` whose parameter and buffer inputs are its own constants (get_attr
    nodes, taken as they are now: an inference compile, as compile_network packs weights
    once), and the positions of the data inputs it still takes, in order."""
    state = [_module_state(n, x) for n, x in zip(_placeholders(gm.graph), inputs)]
    graph = copy.deepcopy(gm.graph)  # the copy's nodes lose Dynamo's metadata
    root = torch.nn.Module()
    slots = []
    for i, (node, x) in enumerate(zip(_placeholders(graph), inputs)):
        if not state[i]:
            slots.append(i)
            continue
        name = f"param{i}"
        root.register_parameter(name, torch.nn.Parameter(x.detach(), requires_grad=False))
        with graph.inserting_before(node):
            node.replace_all_uses_with(graph.get_attr(name))
        graph.erase_node(node)
    bound = {f"param{i}" for i in range(len(inputs))}
    for k, node in enumerate(n for n in graph.nodes if n.op == "get_attr"
                             and n.target not in bound):
        # a tensor Dynamo put in the graph itself (torch._dynamo.config.install_free_tensors)
        value = _attr(gm, node.target)
        name = f"const{k}"
        if isinstance(value, torch.Tensor):
            root.register_buffer(name, value.detach())
        else:
            setattr(root, name, value)
        node.target = name
    return torch.fx.GraphModule(root, graph).eval(), slots


def _attr(module: torch.nn.Module, target: str):
    """The attribute a get_attr node names (a dotted path)."""
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _placeholders(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.op == "placeholder"]


def _module_state(node: torch.fx.Node, x) -> bool:
    """Whether a graph input is a module's parameter or buffer (BatchNorm's running
    statistics): a Parameter, or reached through a module's _parameters or _buffers by
    the source Dynamo records for it."""
    return isinstance(x, torch.nn.Parameter) or \
        _state_source(getattr(node.meta.get("grapharg"), "source", None))


def _state_source(source) -> bool:
    """Whether a Dynamo source reaches through a module's _parameters or _buffers."""
    while source is not None:
        if getattr(source, "member", None) in ("_parameters", "_buffers") or \
                "ParamBuffer" in type(source).__name__:
            return True
        source = getattr(source, "base", None)
    return False


def lean_guards() -> None:
    """Drops, from the frame Dynamo is compiling, the guards whose source is a module's
    parameter or buffer (module docstring). Called from the backend, before Dynamo builds
    the frame's guards from the set."""
    from torch._guards import TracingContext
    from torch.utils._ordered_set import OrderedSet

    ctx = TracingContext.try_get()
    if ctx is None:  # called outside a Dynamo compile (a test calling the backend)
        return
    guards = ctx.guards_context.dynamo_guards
    guards.inner = OrderedSet(g for g in guards.inner
                              if not _state_source(g.originating_source))


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor],
            options: dict | None = None, **_) -> Callable:
    """The torch.compile backend (module docstring)."""
    from raytune_kernels.compile.api import compile_network

    opts = dict(options or {})
    records, target = opts.pop("records", None), opts.pop("target", "llvm")
    dynamo_guards = opts.pop("dynamo_guards", False)
    bound, slots = bind_parameters(gm, example_inputs)
    data = [example_inputs[i] for i in slots]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*run the analytic estimate.*")
            net = compile_network(bound, data, records, target=target, **opts)
    except (RaytuneError, NotImplementedError, TypeError, ValueError) as exc:
        warnings.warn(f"raytune_kernels left a graph of {len(gm.graph.nodes)} nodes to "
                      f"PyTorch: {type(exc).__name__}: {exc}", stacklevel=2)
        return gm.forward
    if not dynamo_guards:
        lean_guards()
    return _runner(gm, net, slots)


def _runner(gm: torch.fx.GraphModule, net, slots: list[int]) -> Callable:
    warned = []

    def run(*args):
        if torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args):
            if not warned:
                warned.append(True)
                warnings.warn("raytune_kernels ran a graph as PyTorch because it was called "
                              "with gradients enabled and inputs or parameters that require "
                              "them; call the model under torch.no_grad() or "
                              "torch.inference_mode() to run the compiled kernels",
                              stacklevel=2)
            return gm.forward(*args)
        out = net(*(args[i] for i in slots))
        return out if isinstance(out, tuple) else (out,)
    run.network = net  # what was compiled, for inspection and tests
    return run
