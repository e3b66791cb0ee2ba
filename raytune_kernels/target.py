"""Target strings: "llvm" (the host CPU), "llvm -mcpu=NAME", "cuda"."""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from .errors import UnknownTargetError

KINDS = ("llvm", "cuda")


@dataclass(frozen=True)
class Target:
    kind: str
    mcpu: str | None = None

    def __str__(self) -> str:
        return self.kind + (f" -mcpu={self.mcpu}" if self.mcpu else "")


def parse_target(text: "str | Target") -> Target:
    """Parse a target string; an unknown kind or option raises UnknownTargetError."""
    if isinstance(text, Target):
        return text
    parts = shlex.split(text or "")
    if not parts or parts[0] not in KINDS:
        raise UnknownTargetError(f"unknown target {text!r}: expected one of "
                                 "'llvm', 'llvm -mcpu=NAME', 'cuda'")
    kind, mcpu = parts[0], None
    for opt in parts[1:]:
        if kind == "llvm" and opt.startswith("-mcpu=") and len(opt) > len("-mcpu="):
            mcpu = opt[len("-mcpu="):]
        else:
            raise UnknownTargetError(f"unknown option {opt!r} in target {text!r}")
    return Target(kind, mcpu)
