"""CUDA C -> cubin and PTX bytes for one GPU arch with NVRTC (through CuPy's bindings):
the only module that touches NVRTC. Failures come back as data, never raised.

Compiling needs the CUDA libraries, not a GPU: builder actors run this on CPU workers.
CuPy is imported lazily so the core package imports without it. The pip wheel
nvidia-cuda-nvrtc-cu12 keeps libnvrtc under site-packages/nvidia/cuda_nvrtc/lib, outside
the loader's search path: when CuPy cannot open NVRTC itself, we load it from there with
RTLD_GLOBAL (so CuPy's own dlopen finds it) and try again.
What the compiler allocated (registers, static shared memory, stack) is read from the cubin
itself, so the schedule space is checked against it whatever NVRTC version built it: ptxas -v's
report ("Used N registers, M bytes smem", spills) is kept in the log, but NVRTC 13 returns
no such report, and every candidate would then fail the launch-limit check.
"""
from __future__ import annotations

import base64
import ctypes
import functools
import glob
import os
import re
import struct
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
    stack_bytes: int | None = None  # per thread: local arrays and register spills
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
    """registers, smem and stack bytes from ptxas -v (None where the log lacks them)."""
    regs = re.search(r"Used (\d+) registers", log)
    smem = re.search(r"(\d+) bytes smem", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    return {"registers": int(regs.group(1)) if regs else None,
            "smem_bytes": int(smem.group(1)) if smem else (0 if regs else None),
            "stack_bytes": int(stack.group(1)) if stack else None}


EIATTR_FRAME_SIZE, EIATTR_REGCOUNT = 0x11, 0x2F  # attribute ids in a cubin's .nv.info
SM90_RESERVED_SMEM = 1024  # sm_90+ cubins count the block's system-reserved shared memory


def _elf_sections(elf: bytes) -> dict[str, tuple[int, int, int]]:
    """name -> (offset, size, sh_info) of every section of a 64-bit little-endian ELF."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = heads[shstrndx][4]
    return {elf[names + h[0]:elf.index(b"\0", names + h[0])].decode(): (h[4], h[5], h[7])
            for h in heads}


def _nv_info(data: bytes) -> dict[int, list[tuple[int, int]]]:
    """attribute -> [(symbol, value)] of a .nv.info section's 8-byte (symbol, value) entries.
    Entries are [format, attribute, payload]: format 1 has no payload, 2 one byte, 3 two, 4 a
    16-bit length and that many bytes."""
    out: dict[int, list[tuple[int, int]]] = {}
    i = 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == 4:
            n, = struct.unpack_from("<H", data, i + 2)
            if n == 8:
                out.setdefault(attr, []).append(struct.unpack_from("<II", data, i + 4))
            i += 4 + n
        else:
            i += {1: 2, 2: 3, 3: 4}.get(fmt, len(data))
    return out


def cubin_resources(cubin: bytes, arch: str) -> dict:
    """registers per thread, static shared memory and stack-frame bytes of the cubin's one
    kernel, read from its ELF sections (`.nv.info`'s REGCOUNT and FRAME_SIZE, the size of
    `.nv.shared.<kernel>`); shared memory is what the kernel declares, as ptxas -v counts it."""
    sections = _elf_sections(cubin)
    texts = [name[len(".text."):] for name in sections if name.startswith(".text.")]
    if len(texts) != 1:
        raise ValueError(f"expected one kernel in the cubin, found {len(texts)}")
    info = sections.get(".nv.info")
    attrs = _nv_info(cubin[info[0]:info[0] + info[1]]) if info else {}
    if EIATTR_REGCOUNT not in attrs:
        raise ValueError("the cubin has no register count")
    smem = sections.get(".nv.shared." + texts[0], (0, 0, 0))[1]
    if smem and int(re.sub(r"\D", "", arch)[:2]) >= 90:
        smem = max(0, smem - SM90_RESERVED_SMEM)
    return {"registers": max(v for _, v in attrs[EIATTR_REGCOUNT]),
            "smem_bytes": smem,
            "stack_bytes": max((v for _, v in attrs.get(EIATTR_FRAME_SIZE, [])), default=0)}


def _resources(cubin: bytes, arch: str, log: str) -> dict:
    """The cubin's own figures; ptxas' report where the cubin cannot be read."""
    try:
        return cubin_resources(cubin, arch)
    except (ValueError, struct.error, IndexError, UnicodeDecodeError):
        return _report(log)


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
        log, cubin = _log(lib, prog), bytes(lib.getCUBIN(prog))
        return CudaBuildResult(arch, cubin, bytes(lib.getPTX(prog)), None, log=log,
                               seconds=time.perf_counter() - start,
                               **_resources(cubin, arch, log))
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
        return ["the register / shared-memory usage could not be read from the build"]
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
                               result.registers, result.smem_bytes, result.stack_bytes,
                               result.log, result.seconds)
    return result
