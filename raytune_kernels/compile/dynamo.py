"""raytune_kernels as a torch.compile backend:

    torch.compile(model, backend="raytune_kernels",
                  options={"records": "r18.jsonl", "target": "llvm", "threads": 2})

TorchDynamo hands the backend each graph it captured (a graph break splits a function into
several) with example inputs; the backend compiles each with compile_network from the
records and returns a callable for it. Dynamo passes a module's parameters and buffers as graph
inputs: they are bound back into the graph as constants (bind_parameters) (so weights are packed once, as in
compile_network), and the compiled callable takes the data inputs alone. A graph that
compile_network refuses stays PyTorch's, with a warning naming why; an op it has no node
for runs as a PyTorch island inside ours, as in compile_network. Inference only: a call
that needs gradients runs the graph as PyTorch would.

Options: records, target, and any keyword of compile_network (threads, fallback, layout,
atol, graph, ...). Dynamo checks its guards (one per module attribute it read) before
every call; after a network has streamed its weights through the caches those checks miss
in them, about 0.3 ms a call for ResNet-18. torch's own `"guard_filter_fn":
torch.compiler.skip_guard_on_all_nn_modules_unsafe` in the same options drops the module
guards, for a model whose modules do not change after compiling. Registered under the name "raytune_kernels" through torch's
`torch_dynamo_backends` entry point (pyproject.toml) when the package is installed.
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
    return torch.fx.GraphModule(root, graph).eval(), slots


def _placeholders(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.op == "placeholder"]


def _module_state(node: torch.fx.Node, x) -> bool:
    """Whether a graph input is a module's parameter or buffer (BatchNorm's running
    statistics): a Parameter, or reached through a module's _parameters or _buffers by
    the source Dynamo records for it."""
    if isinstance(x, torch.nn.Parameter):
        return True
    source = getattr(node.meta.get("grapharg"), "source", None)
    while source is not None:
        if getattr(source, "member", None) in ("_parameters", "_buffers") or \
                "ParamBuffer" in type(source).__name__:
            return True
        source = getattr(source, "base", None)
    return False


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor],
            options: dict | None = None, **_) -> Callable:
    """The torch.compile backend (module docstring)."""
    from raytune_kernels.compile.api import compile_network

    opts = dict(options or {})
    records, target = opts.pop("records", None), opts.pop("target", "llvm")
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
