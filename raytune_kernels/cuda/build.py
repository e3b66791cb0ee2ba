"""CUDA C -> cubin and PTX bytes for one GPU arch with NVRTC (through CuPy's bindings):
the only module that touches NVRTC. Failures come back as data, never raised.

Compiling needs the CUDA libraries, not a GPU: builder actors run this on CPU workers.
CuPy is imported lazily so the core package imports without it. The pip wheel
nvidia-cuda-nvrtc-cu12 keeps libnvrtc under site-packages/nvidia/cuda_nvrtc/lib, outside
the loader's search path: when CuPy cannot open NVRTC itself, we load it from there with
RTLD_GLOBAL (so CuPy's own dlopen finds it) and try again.
ptxas runs with -v: its report ("Used N registers, M bytes smem", spills) is parsed so the
schedule space can be checked against what the compiler actually allocated.
"""
from __future__ import annotations

import base64
import ctypes
import functools
import glob
import os
import re
import sys
import time
from dataclasses import asdict, dataclass

ARCH_RE = re.compile(r"^sm_[0-9]{2,3}[a-z]?$")
REGS_PER_BLOCK = 65536
MAX_REGS_PER_THREAD = 255
MAX_STATIC_SMEM = 48 * 1024
OPTIONS = ("--std=c++17", "--ptxas-options=-v")


@dataclass(frozen=True)
class CudaBuildResult:
    """A compiled kernel (cubin and PTX bytes) with what ptxas reported, or the error."""

    arch: str
    cubin: bytes | None
    ptx: bytes | None
    error: str | None
    registers: int | None = None
    smem_bytes: int | None = None
    spill_bytes: int | None = None
    log: str = ""
    seconds: float = 0.0

    @property
    def library(self) -> bytes | None:
        """The loadable binary, under the name the CPU BuildResult uses."""
        return self.cubin

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("cubin", "ptx"):
            d[k] = base64.b64encode(d[k]).decode() if d[k] is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CudaBuildResult":
        d = dict(d)
        for k in ("cubin", "ptx"):
            d[k] = base64.b64decode(d[k]) if d[k] is not None else None
        return cls(**d)


def _nvrtc_lib_dirs() -> list[str]:
    return sorted({os.path.join(p, "nvidia", "cuda_nvrtc", "lib") for p in sys.path
                   if os.path.isdir(os.path.join(p, "nvidia", "cuda_nvrtc", "lib"))})


def _preload_wheel_nvrtc() -> bool:
    """Load libnvrtc from the pip wheel's directory, globally; True when one loaded."""
    for d in _nvrtc_lib_dirs():
        for path in sorted(glob.glob(os.path.join(d, "libnvrtc.so*"))):
            if "builtins" in path or ".alt." in path:
                continue
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return True
            except OSError:
                continue
    return False


@functools.cache
def _nvrtc():
    """CuPy's NVRTC bindings, working, or the reason they are not (a string)."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as exc:
        return f"cupy is not installed (pip install cupy-cuda12x): {exc}"
    try:
        nvrtc.getVersion()
        return nvrtc
    except Exception as first:  # libnvrtc not found by CuPy: try the wheel's copy
        if _preload_wheel_nvrtc():
            try:
                nvrtc.getVersion()
                return nvrtc
            except Exception as exc:
                return f"NVRTC failed to load: {exc}"
        return (f"NVRTC is not loadable ({first}); pip install nvidia-cuda-nvrtc-cu12")


def nvrtc_unavailable() -> str | None:
    """None when NVRTC can compile here; otherwise why not."""
    lib = _nvrtc()
    return lib if isinstance(lib, str) else None


def nvrtc_version() -> tuple[int, int] | None:
    lib = _nvrtc()
    return None if isinstance(lib, str) else tuple(lib.getVersion())


def _report(log: str) -> dict:
    """registers, smem and spill bytes from ptxas -v (None where the log lacks them)."""
    regs = re.search(r"Used (\d+) registers", log)
    smem = re.search(r"(\d+) bytes smem", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"registers": int(regs.group(1)) if regs else None,
            "smem_bytes": int(smem.group(1)) if smem else (0 if regs else None),
            "spill_bytes": int(spills.group(1)) + int(spills.group(2)) if spills else None}


def compile_cuda(source: str, arch: str, name: str = "kernel.cu",
                 options: tuple[str, ...] = ()) -> CudaBuildResult:
    """NVRTC-compile `source` for `arch` ("sm_80", "sm_90", ...) to cubin and PTX."""
    start = time.perf_counter()

    def failed(msg: str, log: str = "") -> CudaBuildResult:
        return CudaBuildResult(arch, None, None, msg, log=log,
                               seconds=time.perf_counter() - start)
    if not isinstance(arch, str) or not ARCH_RE.match(arch):
        return failed(f"bad arch {arch!r}: expected sm_XY, e.g. sm_80 or sm_90")
    lib = _nvrtc()
    if isinstance(lib, str):
        return failed(lib)
    opts = [f"--gpu-architecture={arch}", *OPTIONS, *options]
    try:
        prog = lib.createProgram(source, name, [], [])
    except Exception as exc:
        return failed(f"NVRTC could not create a program: {exc}")
    try:
        try:
            lib.compileProgram(prog, opts)
        except Exception as exc:
            log = _log(lib, prog)
            return failed(f"NVRTC compile failed for {arch}: {exc}\n{log}".strip(), log)
        log = _log(lib, prog)
        return CudaBuildResult(arch, bytes(lib.getCUBIN(prog)), bytes(lib.getPTX(prog)), None,
                               log=log, seconds=time.perf_counter() - start, **_report(log))
    except Exception as exc:  # a bad candidate must not crash its builder
        return failed(f"{type(exc).__name__}: {exc}")
    finally:
        lib.destroyProgram(prog)


def _log(lib, prog) -> str:
    try:
        raw = lib.getProgramLog(prog)
    except Exception as exc:
        return f"(no log: {exc})"
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return text.rstrip("\x00").strip()


def resource_problems(result: CudaBuildResult, threads: int) -> list[str]:
    """What the compiled kernel would break at launch with `threads` per block."""
    problems = []
    if result.registers is None or result.smem_bytes is None:
        return ["ptxas reported no register / shared-memory usage"]
    if result.registers > MAX_REGS_PER_THREAD:
        problems.append(f"{result.registers} registers per thread > {MAX_REGS_PER_THREAD}")
    if result.registers * threads > REGS_PER_BLOCK:
        problems.append(f"{result.registers} registers x {threads} threads > "
                        f"{REGS_PER_BLOCK} per block")
    if result.smem_bytes > MAX_STATIC_SMEM:
        problems.append(f"{result.smem_bytes} bytes of static shared memory > "
                        f"{MAX_STATIC_SMEM}")
    return problems


def build_cuda(compute, cfg, arch: str) -> CudaBuildResult:
    """Render and compile one candidate for `arch`; a config that does not render, a
    compile error, or a kernel over the launch limits comes back as the error."""
    from raytune_kernels.cuda.render import render_cuda

    start = time.perf_counter()
    try:
        kernel = render_cuda(compute, cfg)
    except Exception as exc:
        return CudaBuildResult(arch, None, None, f"{type(exc).__name__}: {exc}",
                               seconds=time.perf_counter() - start)
    result = compile_cuda(kernel.source, arch, f"{kernel.name}.cu")
    problems = [] if result.error else resource_problems(result, kernel.threads)
    if problems:
        return CudaBuildResult(arch, None, None, "over launch limits: " + "; ".join(problems),
                               result.registers, result.smem_bytes, result.spill_bytes,
                               result.log, result.seconds)
    return result
