"""What a capture builds with: graph values (T), the node and parameter accumulator
(Builder), where a call came from (Ctx), argument binding, and the small checks every op
handler shares."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from raytune_kernels.errors import UnsupportedOpError


@dataclass(frozen=True)
class T:
    """A tensor argument: the graph value that holds it and its concrete example value."""

    ref: str
    value: torch.Tensor


class Builder:
    """Accumulates nodes and parameters while a capture walks the traced graph."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.params: dict[str, torch.Tensor] = {}
        self._taken: set[str] = set()

    def unique(self, hint: str) -> str:
        base = hint.replace(".", "_") or "v"
        name, i = base, 1
        while name in self._taken:
            name, i = f"{base}_{i}", i + 1
        self._taken.add(name)
        return name

    def param(self, hint: str, tensor: torch.Tensor) -> T:
        if tensor.dtype != torch.float32:
            raise UnsupportedOpError(f"parameter of dtype {tensor.dtype}", hint,
                                     "only float32 networks are supported")
        name = hint if hint not in self._taken else self.unique(hint)
        self._taken.add(name)
        value = tensor.detach().clone().contiguous()
        self.params[name] = value
        return T(name, value)

    def snapshot(self) -> tuple:
        return list(self.nodes), dict(self.params), set(self._taken)

    def restore(self, saved: tuple) -> None:
        """Back to a snapshot: what a refused attempt added is gone."""
        self.nodes, self.params, self._taken = list(saved[0]), dict(saved[1]), set(saved[2])

    def node(self, op: str, inputs: list, attrs: dict, out: torch.Tensor, ctx: "Ctx") -> T:
        from raytune_kernels.frontend.graph import Node
        name = self.unique(ctx.hint)
        refs = tuple(t.ref for t in inputs)
        self.nodes.append(Node(name, op, refs, tuple(sorted(attrs.items())),
                               tuple(out.shape), ctx.layer))
        return T(name, out)


@dataclass(frozen=True)
class Ctx:
    """Where a call came from: its layer (module path) and a name hint for its node."""

    layer: str
    hint: str
    what: str

    def unsupported(self, detail: str = "") -> UnsupportedOpError:
        return UnsupportedOpError(self.what, self.layer, detail)


def bind(stub: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    kwargs = {("input" if k == "self" else k): v for k, v in kwargs.items()}
    bound = inspect.signature(stub).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        return (int(v[0]), int(v[-1])) if len(v) in (1, 2) else tuple(v)  # type: ignore
    return (int(v), int(v))


def need_param(b: Builder, t: Any, ctx: Ctx, role: str) -> T:
    if not isinstance(t, T) or t.ref not in b.params:
        raise ctx.unsupported(f"the {role} must be a constant parameter, not a computed tensor")
    return t


def tensor_arg(t: Any, ctx: Ctx, role: str = "input") -> T:
    if not isinstance(t, T):
        raise ctx.unsupported(f"expected a tensor as {role}, got {type(t).__name__}")
    return t


def norm_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d
