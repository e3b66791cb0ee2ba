"""Tasks: deduplicated, target-independent units of tuning.

A Task is one anchor op (conv2d, dense, matmul, pool, softmax, layer norm, or a bare
elementwise chain) with the elementwise ops fused after it as an epilogue. Its key hashes the
compute only (op, shapes, attributes, dtype, epilogue): never the target or the layout, so the
same network yields the same keys for "llvm" and "cuda".
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

KEY_LENGTH = 16


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str = "float32"

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, d: dict) -> "TensorSpec":
        return cls(tuple(d["shape"]), d["dtype"])

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

# The op vocabulary of epilogues, one list for every layer that names ops: the graph, the
# references (frontend/reference.py), the loop-nest interpreter, the LLVM math
# (cpu/llvm/math_ops.py) and the CUDA epilogue (cuda/epilogue.py); tests/test_task.py
# checks each implements exactly these names. "bias" and "affine" are channel ops.
# "prelu" and "elu" are activations with a parameter, which they take as binary ops take
# their second operand (a scalar, or a tensor: PReLU's per-channel slopes).
UNARY_OPS = ("relu", "relu6", "gelu", "gelu_tanh", "sigmoid", "silu", "tanh", "hardswish",
             "hardsigmoid", "mish", "exp", "erf", "sqrt", "rsqrt", "square", "neg", "abs",
             "softplus")
BINARY_OPS = ("add", "sub", "mul", "div", "maximum", "minimum", "prelu", "elu")


@dataclass(frozen=True)
class EpilogueOp:
    """One elementwise step applied to the accumulator before the store.

    `bias` and `affine` broadcast their operands along `axis` of the output; the binary
    ops (`add`, `sub`, `mul`, `div`, `maximum`, `minimum`, `prelu`: x if x >= 0 else a*x,
    `elu`: x if x > 0 else a*(e^x - 1)) take either one tensor operand a (numpy
    broadcasting) or a `scalar`; `reverse` means operand-op-acc. Unary ops take nothing
    (`softplus` is log(1 + e^x), PyTorch's with beta 1).
    """

    op: str
    operands: tuple[TensorSpec, ...] = ()
    scalar: float | None = None
    reverse: bool = False
    axis: int | None = None

    def to_json(self) -> dict:
        return {"op": self.op, "operands": [o.to_json() for o in self.operands],
                "scalar": self.scalar, "reverse": self.reverse, "axis": self.axis}

    @classmethod
    def from_json(cls, d: dict) -> "EpilogueOp":
        return cls(d["op"], tuple(TensorSpec.from_json(o) for o in d["operands"]),
                   d["scalar"], d["reverse"], d["axis"])


@dataclass(frozen=True)
class Compute:
    """What a task computes: the anchor op on `inputs`, then `epilogue`, giving `output`."""

    op: str
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    attrs: tuple[tuple[str, Any], ...] = ()
    epilogue: tuple[EpilogueOp, ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)

    def to_json(self) -> dict:
        return {"op": self.op, "inputs": [t.to_json() for t in self.inputs],
                "output": self.output.to_json(),
                "attrs": {k: _plain(v) for k, v in self.attrs},
                "epilogue": [e.to_json() for e in self.epilogue]}

    @classmethod
    def from_json(cls, d: dict) -> "Compute":
        attrs = tuple(sorted((k, _frozen(v)) for k, v in d["attrs"].items()))
        return cls(d["op"], tuple(TensorSpec.from_json(t) for t in d["inputs"]),
                   TensorSpec.from_json(d["output"]), attrs,
                   tuple(EpilogueOp.from_json(e) for e in d["epilogue"]))

    def key(self) -> str:
        key = self.__dict__.get("_key")  # every lowered config names its kernel by it
        if key is None:
            text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
            key = hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]
            object.__setattr__(self, "_key", key)
        return key

    def flops(self) -> int:
        return _anchor_flops(self) + self.output.numel * len(self.epilogue)

    def describe(self) -> str:
        """A short human description: op, shapes, notable attributes, epilogue."""
        shapes = "x".join(str(s) for s in self.inputs[0].shape)
        extra = ""
        if self.op == "conv2d":
            k = self.inputs[1].shape
            extra = (f" -> {k[0]}ch k{k[2]}x{k[3]} s{_pair_text(self.attr('stride'))}"
                     + (f" g{self.attr('groups')}" if self.attr("groups") != 1 else "")
                     + (f" d{_pair_text(self.attr('dilation'))}"
                        if tuple(self.attr("dilation")) != (1, 1) else ""))
        elif self.op in ("dense", "matmul"):
            extra = f" -> {'x'.join(str(s) for s in self.output.shape)}"
        epi = "".join(f"+{e.op}" for e in self.epilogue)
        return f"{self.op} {shapes}{extra}{(' ' + epi) if epi else ''}"


def _pair_text(v: tuple) -> str:
    """A stride or dilation: one number when both axes agree (1-D convs differ: 1x2)."""
    return str(v[0]) if v[0] == v[1] else f"{v[0]}x{v[1]}"


def _plain(v: Any) -> Any:
    return list(_plain(x) for x in v) if isinstance(v, tuple) else v


def _frozen(v: Any) -> Any:
    return tuple(_frozen(x) for x in v) if isinstance(v, list) else v


def _anchor_flops(c: Compute) -> int:
    out = c.output.numel
    if c.op == "conv2d":
        w = c.inputs[1].shape  # [K, C/groups, kh, kw]
        return 2 * out * w[1] * w[2] * w[3]
    if c.op == "dense":
        return 2 * out * c.inputs[1].shape[1]
    if c.op == "matmul":
        return 2 * out * c.inputs[0].shape[-1]
    if c.op in ("max_pool2d", "avg_pool2d"):
        kh, kw = c.attr("kernel")
        return out * kh * kw
    if c.op == "adaptive_avg_pool2d":
        return c.inputs[0].numel
    if c.op == "softmax":
        return 5 * out
    if c.op == "layer_norm":
        return 8 * out
    if c.op == "reduce":
        return c.inputs[0].numel
    return 0


@dataclass(frozen=True)
class Task:
    """A unit of tuning: a compute, how many layers share it (weight) and which layers."""

    key: str
    compute: Compute
    weight: int
    layers: tuple[str, ...] = field(default=())

    @property
    def flops(self) -> int:
        return self.compute.flops()

    def to_json(self) -> dict:
        return {"key": self.key, "compute": self.compute.to_json(), "weight": self.weight,
                "layers": list(self.layers)}

    @classmethod
    def from_json(cls, d: dict) -> "Task":
        compute = Compute.from_json(d["compute"])
        if compute.key() != d["key"]:
            raise ValueError(f"task key {d['key']} does not match its compute "
                             f"({compute.key()})")
        return cls(d["key"], compute, int(d["weight"]), tuple(d["layers"]))
