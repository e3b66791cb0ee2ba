"""Where this machine keeps what it measured or built for later runs (transform costs,
compiled kernel libraries): $RAYTUNE_KERNELS_CACHE, else $XDG_CACHE_HOME/raytune-kernels,
else ~/.cache/raytune-kernels. RAYTUNE_KERNELS_CACHE="" turns every cache off."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Iterable, Sequence

CACHE_ENV = "RAYTUNE_KERNELS_CACHE"


def cache_dir() -> pathlib.Path | None:
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return pathlib.Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "raytune-kernels"


def code_fingerprint(machine: Sequence[str], sources: Iterable[str]) -> str:
    """A machine (its identity as strings: CPU name, ISA, library versions) and the code a
    cached result came from: the bytes of `sources` (paths inside the package, in order; a
    folder is its .py files, sorted). A cache keyed by it is not read after any of them
    changes."""
    root = pathlib.Path(__file__).resolve().parent
    h = hashlib.sha256(json.dumps(list(machine)).encode())
    for rel in sources:
        path = root / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f.read_bytes())
    return h.hexdigest()[:16]
