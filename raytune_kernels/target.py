"""Target strings: "llvm" (the host CPU), "llvm -mcpu=NAME", "cuda", "cuda -arch=sm_XY",
with "-precision=fp32|tf32|fp16|bf16" for cuda and "-precision=fp32|bf16" for llvm
(raytune_kernels/precision.py).

A cuda target without -arch means the measuring GPU's own arch (GpuMeasurerActor.arch).
The precision is part of the target's string, so records of one precision never serve
another; fp32, the default, is left out of it (older records stay valid).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from raytune_kernels.errors import UnknownTargetError
from raytune_kernels.precision import DEFAULT, PRECISIONS

KINDS = ("llvm", "cuda")
CPU_PRECISIONS = ("fp32", "bf16")  # bf16: AMX tiles (cpu/amx.py)


@dataclass(frozen=True)
class Target:
    kind: str
    mcpu: str | None = None
    arch: str | None = None  # cuda only: the NVRTC arch, e.g. "sm_90"
    precision: str = DEFAULT  # the arithmetic the kernels may use

    def __str__(self) -> str:
        return (self.kind + (f" -mcpu={self.mcpu}" if self.mcpu else "")
                + (f" -arch={self.arch}" if self.arch else "")
                + (f" -precision={self.precision}" if self.precision != DEFAULT else ""))


def parse_target(text: "str | Target") -> Target:
    """Parse a target string; an unknown kind or option raises UnknownTargetError."""
    if isinstance(text, Target):
        return text
    parts = shlex.split(text or "")
    if not parts or parts[0] not in KINDS:
        raise UnknownTargetError(f"unknown target {text!r}: expected one of "
                                 "'llvm', 'llvm -mcpu=NAME', 'cuda', 'cuda -arch=sm_XY', "
                                 "'cuda -precision=tf32'")
    kind, mcpu, arch, precision = parts[0], None, None, DEFAULT
    for opt in parts[1:]:
        if kind == "llvm" and opt.startswith("-mcpu=") and len(opt) > len("-mcpu="):
            mcpu = opt[len("-mcpu="):]
        elif kind == "cuda" and re.fullmatch(r"-arch=sm_[0-9]{2,3}[a-z]?", opt):
            arch = opt[len("-arch="):]
        elif opt.startswith("-precision="):
            precision = opt[len("-precision="):]
            allowed = PRECISIONS if kind == "cuda" else CPU_PRECISIONS
            if precision not in allowed:
                raise UnknownTargetError(f"unknown precision {precision!r} for {kind} in "
                                         f"target {text!r}: expected one of "
                                         f"{', '.join(allowed)}")
        else:
            raise UnknownTargetError(f"unknown option {opt!r} in target {text!r}")
    return Target(kind, mcpu, arch, precision)


def target_arg(text: str) -> Target:
    """parse_target as an argparse `type=`: a bad --target is a usage error (exit 2)."""
    import argparse

    try:
        return parse_target(text)
    except UnknownTargetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
