"""The core package must not import Ray: it is used by actors, never the other way round."""
import pathlib
import subprocess
import sys

import raytune_kernels

CORE = pathlib.Path(raytune_kernels.__file__).parent


def test_every_core_module_imports_without_ray():
    modules = sorted("raytune_kernels." + ".".join(p.relative_to(CORE).with_suffix("").parts)
                     for p in CORE.rglob("*.py") if p.stem not in ("__init__", "__main__"))
    code = ("import sys; sys.modules['ray'] = None; sys.modules['actors'] = None\n"
            + "".join(f"import {m}\n" for m in modules))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(modules) >= 60 and "raytune_kernels.tune.tuner" in modules
