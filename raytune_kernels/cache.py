"""Where this machine keeps what it measured or built for later runs (transform costs,
compiled kernel libraries): $RAYTUNE_KERNELS_CACHE, else $XDG_CACHE_HOME/raytune-kernels,
else ~/.cache/raytune-kernels. RAYTUNE_KERNELS_CACHE="" turns every cache off."""
from __future__ import annotations

import os
import pathlib

CACHE_ENV = "RAYTUNE_KERNELS_CACHE"


def cache_dir() -> pathlib.Path | None:
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return pathlib.Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "raytune-kernels"
