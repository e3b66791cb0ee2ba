"""Inlining: a call the frontend has no handler for, captured by what it does inside.

torch.fx keeps torch.nn modules (nn.MultiheadAttention) and functions marked with
torch.fx.wrap (torchvision's shifted_window_attention) as single calls. Before such a call
becomes a PyTorch island, it is exported on its example values with torch.export, and the
aten ops it is made of are walked like the rest of the model: attention lowers to our
matmul and softmax kernels, and only an op inside without a handler stays in PyTorch.

The inlined form is kept when it puts at least one op in our kernels; otherwise (one
unknown aten op standing for the whole call, or an export that fails) the call stays one
island named as the user wrote it. Nothing a failed attempt added to the graph survives.

torch.export keeps a `with torch.autocast(..., enabled=False)` block as one call of the
higher-order op wrap_with_autocast on a subgraph; with autocast off, the block computes in
the dtypes it is given (float32 here), so `autocast_off` hands its subgraph to the walker
as if the block were not there. A block with autocast on stays an island.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.nn as nn

from raytune_kernels.frontend.island import Island


class _Call(nn.Module):
    """`island` as a module whose inputs are the call's graph tensors, in slot order; a
    module call is held as a submodule, so its weights are named after their attributes."""

    def __init__(self, island: Island):
        super().__init__()
        self.island = island
        if isinstance(island.call, nn.Module):
            self.inner = island.call

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.island(*tensors)


def autocast_off(target: Any, args: tuple) -> tuple[torch.fx.GraphModule, tuple] | None:
    """(subgraph, operands) of a wrap_with_autocast call whose autocast is off, else None.
    Its arguments are (device_type, dtype, enabled, cache_enabled, subgraph, *operands)."""
    hop = getattr(torch.ops.higher_order, "wrap_with_autocast", None)
    if hop is None or target is not hop or len(args) < 5 or args[2] is not False:
        return None
    return (args[4], tuple(args[5:])) if isinstance(args[4], torch.fx.GraphModule) else None


def inlinable(call: Callable) -> bool:
    """Modules and Python functions: what has insides worth exporting (an aten op or a
    builtin has none)."""
    return isinstance(call, nn.Module) or inspect.isfunction(call)


def export_call(island: Island, values: list[torch.Tensor]) -> torch.fx.GraphModule | None:
    """The aten graph of `island` called on `values`, or None where torch.export cannot
    capture it (control flow on values, an unsupported construct)."""
    try:
        with torch.no_grad():
            return torch.export.export(_Call(island), tuple(values), strict=False).module()
    except Exception:  # noqa: BLE001 - any export failure leaves the call an island
        return None
