"""Target strings: "llvm" (the host CPU), "llvm -mcpu=NAME", "cuda", "cuda -arch=sm_XY".

A cuda target without -arch means the measuring GPU's own arch (GpuMeasurerActor.arch).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from raytune_kernels.errors import UnknownTargetError

KINDS = ("llvm", "cuda")


@dataclass(frozen=True)
class Target:
    kind: str
    mcpu: str | None = None
    arch: str | None = None  # cuda only: the NVRTC arch, e.g. "sm_90"

    def __str__(self) -> str:
        return (self.kind + (f" -mcpu={self.mcpu}" if self.mcpu else "")
                + (f" -arch={self.arch}" if self.arch else ""))


def parse_target(text: "str | Target") -> Target:
    """Parse a target string; an unknown kind or option raises UnknownTargetError."""
    if isinstance(text, Target):
        return text
    parts = shlex.split(text or "")
    if not parts or parts[0] not in KINDS:
        raise UnknownTargetError(f"unknown target {text!r}: expected one of "
                                 "'llvm', 'llvm -mcpu=NAME', 'cuda', 'cuda -arch=sm_XY'")
    kind, mcpu, arch = parts[0], None, None
    for opt in parts[1:]:
        if kind == "llvm" and opt.startswith("-mcpu=") and len(opt) > len("-mcpu="):
            mcpu = opt[len("-mcpu="):]
        elif kind == "cuda" and re.fullmatch(r"-arch=sm_[0-9]{2,3}[a-z]?", opt):
            arch = opt[len("-arch="):]
        else:
            raise UnknownTargetError(f"unknown option {opt!r} in target {text!r}")
    return Target(kind, mcpu, arch)


def target_arg(text: str) -> Target:
    """parse_target as an argparse `type=`: a bad --target is a usage error (exit 2)."""
    import argparse

    try:
        return parse_target(text)
    except UnknownTargetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
