"""PyTorch islands: a call the frontend has no node of its own for, kept as a "torch" node
that replays the call on its tensor arguments.

A network with one new op still compiles: the island runs in PyTorch between our kernels
(glue, in NCHW), the rest runs ours. The capture warns once, naming each island's op and
layer; capture(..., strict=True) refuses them instead, as before islands existed.

Graph values live in float32 buffers, so an island records the dtype each tensor argument
had at capture (an int64 index, a bool mask) and casts it back before the call; its own
output is stored as float32, which is exact for bools and for integers below 2**24.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

ISLAND = "torch"  # the graph op of an island node


@dataclass(frozen=True)
class MethodCall:
    """A Tensor method called by name: x.chunk(2, 1) is MethodCall("chunk")(x, 2, 1)."""

    name: str

    def __call__(self, this: Any, *args, **kwargs):
        return getattr(this, self.name)(*args, **kwargs)


@dataclass(frozen=True, eq=False)
class Island:
    """`call(*args, **kwargs)` with each graph tensor put back in its slot of the flattened
    arguments; `index` picks one output of a call that returns several."""

    what: str  # the op as the user wrote it: "Tensor.chunk", "Hardswish", "aten::erf"
    call: Callable
    spec: Any  # the pytree spec of (args, kwargs)
    leaves: tuple  # the flattened arguments, None in the slots of graph tensors
    slots: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]  # each graph tensor's dtype at capture
    index: int | None = None
    moved: dict = field(default_factory=dict, compare=False, repr=False)  # device -> call

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        device = tensors[0].device if tensors else torch.device("cpu")
        leaves = [leaf.to(device) if isinstance(leaf, torch.Tensor) else leaf
                  for leaf in self.leaves]
        for slot, t, dtype in zip(self.slots, tensors, self.dtypes):
            leaves[slot] = t if t.dtype == dtype else t.to(dtype)
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        out = self._call_on(device)(*args, **kwargs)
        return out if self.index is None else pytree.tree_flatten(out)[0][self.index]

    def _call_on(self, device: torch.device) -> Callable:
        """The call; a module with weights is copied to the device of the values once."""
        if device.type == "cpu" or not isinstance(self.call, torch.nn.Module):
            return self.call
        if device not in self.moved:
            self.moved[device] = copy.deepcopy(self.call).to(device)
        return self.moved[device]

    def at(self, index: int) -> "Island":
        """The same call, keeping leaf `index` of its flattened outputs (counting every
        leaf, tensors or not)."""
        return Island(self.what, self.call, self.spec, self.leaves, self.slots, self.dtypes,
                      index)


def island_of(what: str, call: Callable, args: tuple, kwargs: dict,
              is_value: Callable[[Any], bool], value_of: Callable[[Any], torch.Tensor]
              ) -> tuple[Island, list]:
    """The island of `call(*args, **kwargs)` whose graph values are the leaves for which
    `is_value` holds, and those leaves (the island node's inputs, in slot order)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    slots = tuple(i for i, leaf in enumerate(leaves) if is_value(leaf))
    values = [leaves[i] for i in slots]
    kept = tuple(None if i in slots else leaf for i, leaf in enumerate(leaves))
    dtypes = tuple(value_of(v).dtype for v in values)
    return Island(what, call, spec, kept, slots, dtypes), values
