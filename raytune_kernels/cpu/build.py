"""Build LLVM IR text into a shared library (bytes) and load one: the only module that
touches llvmlite.binding. Only bytes leave this module across process boundaries.

Pipeline: parse, verify, SROA and CFG simplification (IR_PASSES), emit an object for the host
CPU (or -mcpu) at codegen level 3, link (linker(): `ld -shared ... -lgomp -lm`). The
renderer already emits what O3 would make of a kernel (explicit vectors, unrolled where the
schedule says): O3's module pipeline cost 8x the time of these two passes and gave the same
kernels (measured on the tuned ResNet-18, MobileNetV2 and BERT kernels: sums within 0.2%).
Code generation runs without two of its passes (CODEGEN_OPTIONS):
- the pre-RA machine scheduler: it hoists the broadcasts of an unrolled channel block above
  their FMAs and spills them (measured: 74-84% -> 91-96% of peak);
- loop strength reduction: on our unrolled bodies it was up to two thirds of code
  generation (a Winograd kernel: 66 of 101 ms), and the kernels did not need it (the tuned
  ResNet-18 kernels, built both ways and timed interleaved in one process at 2
  threads: weighted sums 5425 vs 5440 us, each kernel within -10%..+4%, as many faster as
  slower; MobileNetV2's within run-to-run noise). Builds of those kernels: 1.29 -> 0.70 s.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import errno
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

ALIGN = 64  # bytes: kernel buffers start on a cache line
_lock = threading.Lock()


@dataclass(frozen=True)
class BuildResult:
    """A built kernel: the shared library's bytes, or the error as data."""

    library: bytes | None
    error: str | None
    seconds: float
    host: bool = False  # the error is this machine's (a full temp dir), not the candidate's
    # (phase, seconds) of this build, in order (BUILD_PHASES; none for a cached library):
    # where a trial's build time went, added up by the pipeline (PipelineStats)
    phases: tuple[tuple[str, float], ...] = ()


# lowering and IR text (cpu/kernel.py); LLVM parse, verify and passes; object emission; cc
BUILD_PHASES = ("render", "optimize", "codegen", "link")


@contextlib.contextmanager
def timed(phase: str, into: list) -> Iterator[None]:
    """Append (phase, seconds the block took) to `into`, also when the block raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        into.append((phase, time.perf_counter() - start))


# errors of the machine, not of a candidate: building or loading it again later may work
HOST_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE,
                         errno.ENOMEM, errno.EROFS})
LOW_SPACE_BYTES = 1 << 20


def host_fault(exc: BaseException) -> str | None:
    """Why `exc` is the host's fault (a full or read-only temp directory, no file
    descriptors or memory left), or None when it may be the candidate's. A linker that
    fails with the temp directory nearly full counts as well: cc reports it only as text."""
    tmp = tempfile.gettempdir()
    if isinstance(exc, OSError) and exc.errno in HOST_ERRNOS:
        return f"{os.strerror(exc.errno)} (temp directory {tmp})"
    try:
        free = os.statvfs(tmp)
        left = free.f_bavail * free.f_frsize
    except OSError as stat_exc:
        return f"temp directory {tmp} unusable: {stat_exc}"
    if left < LOW_SPACE_BYTES:
        return f"temp directory {tmp} is full ({left} bytes free)"
    return None


CODEGEN_OPTIONS = ("-enable-misched=false", "-disable-lsr")


@functools.cache
def _llvm():
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    for option in CODEGEN_OPTIONS:
        llvm.set_option("", option)
    return llvm


@functools.cache
def host_cpu() -> tuple[str, str]:
    llvm = _llvm()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


_LIST_CPUS = """
import llvmlite.binding as llvm
llvm.initialize_native_target(); llvm.initialize_native_asmprinter()
target = llvm.Target.from_triple(llvm.get_process_triple())
machine = target.create_target_machine(cpu="help")  # LLVM lists its CPUs on stderr
machine.emit_object(llvm.parse_assembly("define void @f() { ret void }"))
"""


@functools.cache
def known_cpus() -> frozenset[str]:
    """The CPU names LLVM knows for this process's target (what -mcpu may name), read
    from LLVM's own list in a child process (an unknown name aborts LLVM: never ask it
    in this one)."""
    import sys

    proc = subprocess.run([sys.executable, "-c", _LIST_CPUS], capture_output=True,
                          text=True, timeout=60)
    lines = proc.stderr.split("Available CPUs for this target:", 1)[-1].splitlines()
    names = {ln.split()[0] for ln in lines if " - " in ln and ln.startswith("  ")}
    names.discard("Available")
    return frozenset(names)


def mcpu_problem(mcpu: str | None) -> str | None:
    """Why `-mcpu=mcpu` cannot be used here (None when it can, or when none is given):
    a name LLVM does not know makes every build abort."""
    if not mcpu or mcpu == host_cpu()[0]:
        return None
    cpus = known_cpus()
    if cpus and mcpu not in cpus:
        near = sorted(c for c in cpus if c[:3] == mcpu[:3])[:8]
        return (f"-mcpu={mcpu} is not a CPU LLVM knows"
                + (f" (similar: {', '.join(near)})" if near else "")
                + f"; this host is {host_cpu()[0]}")
    return None


@functools.cache
def _target_machine(mcpu: str | None):
    llvm = _llvm()
    name, features = host_cpu()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    cpu, feats = (name, features) if not mcpu or mcpu == name else (mcpu, "")
    return target.create_target_machine(cpu=cpu, features=feats, opt=3, reloc="pic",
                                        codemodel="default")


# accumulator tiles live in allocas until SROA makes them registers; SimplifyCFG folds the
# guards of loops whose trip counts are constants
IR_PASSES = ("sroa", "simplify_cfg")


def compile_object(ir_text: str, mcpu: str | None = None, phases: list | None = None
                   ) -> bytes:
    """IR text -> object bytes; the "optimize" and "codegen" seconds go to `phases`."""
    llvm, phases = _llvm(), [] if phases is None else phases
    with _lock:  # LLVM's global state (cl::opts, target machine) is not ours to race on
        tm = _target_machine(mcpu)
        with timed("optimize", phases):
            mod = llvm.parse_assembly(ir_text)
            mod.triple = llvm.get_process_triple()
            mod.data_layout = str(tm.target_data)
            mod.verify()
            passes = llvm.ModulePassManager()
            for name in IR_PASSES:
                getattr(passes, f"add_{name}_pass")()
            passes.run(mod, llvm.create_pass_builder(tm, llvm.PipelineTuningOptions()))
        with timed("codegen", phases):
            obj = tm.emit_object(mod)
            mod.close()  # freeing a large module's IR takes milliseconds: the build's too
        return obj


@functools.cache
def linker() -> tuple[str, ...]:
    """How an object becomes a shared library: `ld -shared` itself, told where libgomp
    lies (asked of cc once), since the cc driver in front of it cost as much again as the
    link (9.4 against 5.6 ms a kernel, on every build); `cc -shared` where ld or
    libgomp's directory cannot be found."""
    import shutil

    ld = shutil.which("ld")
    try:
        gomp = subprocess.run(["cc", "-print-file-name=libgomp.so"], capture_output=True,
                              text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gomp = ""
    if ld and os.path.isabs(gomp) and os.path.exists(gomp):
        command = (ld, "-shared", "--eh-frame-hdr", f"-L{os.path.dirname(gomp)}")
        if _links(command):  # ld alone may not know where this system keeps libm
            return command
    return ("cc", "-shared")


def _links(command: tuple[str, ...]) -> bool:
    """Whether `command` links a trivial object against LINK's libraries here."""
    obj = compile_object("define void @rk_link_probe() {\n  ret void\n}\n")
    with tempfile.TemporaryDirectory(prefix=f"rk_build_{os.getpid()}_") as d:
        o, so = os.path.join(d, "p.o"), os.path.join(d, "p.so")
        with open(o, "wb") as f:
            f.write(obj)
        try:
            proc = subprocess.run([*command, "-o", so, o, *LINK], capture_output=True,
                                  timeout=60)
        except (OSError, subprocess.SubprocessError):
            return False
        return proc.returncode == 0


def link_shared(obj: bytes, phases: list | None = None) -> bytes:
    """Object bytes -> shared library bytes (linker()); its seconds go to `phases`."""
    with timed("link", [] if phases is None else phases), \
            tempfile.TemporaryDirectory(prefix=f"rk_build_{os.getpid()}_") as d:
        o, so = os.path.join(d, "k.o"), os.path.join(d, "k.so")
        with open(o, "wb") as f:
            f.write(obj)
        proc = subprocess.run([*linker(), "-o", so, o, *LINK], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"link failed: {proc.stderr.strip()}")
        with open(so, "rb") as f:
            return f.read()


BUILD_CACHE_SIZE = 256  # libraries of a few tens of KiB each
LINK = ("-lgomp", "-lm")


def build(ir_text: str, mcpu: str | None = None, persist: bool = False) -> BuildResult:
    """IR text -> shared library bytes; any failure is returned as data, never raised.
    Successful builds are kept by content (the IR and the CPU), so compile_network builds
    a kernel it already built (checked in a child, then planned) once: such a build
    takes the lookup's seconds and has no phases (none of its work was done again).
    `persist` keeps the library on disk as well (cache.py's directory, `libraries/`),
    for the next process that builds the same IR for the same CPU: compile_network's
    kernels, so that compiling a network again builds nothing."""
    start = time.perf_counter()
    key = _key(ir_text, mcpu)
    if key in _built:
        _built.move_to_end(key)
        if persist and _built[key].library is not None:  # built here unpersisted before
            _disk_put(key, _built[key].library, only_new=True)
        return dataclasses.replace(_built[key], seconds=time.perf_counter() - start,
                                   phases=())
    if persist and (lib := _disk_get(key)) is not None:
        _built[key] = BuildResult(lib, None, time.perf_counter() - start)
        return _built[key]
    phases: list[tuple[str, float]] = []
    try:
        lib = link_shared(compile_object(ir_text, mcpu, phases), phases)
    except Exception as exc:  # a bad candidate must not crash its caller
        host = host_fault(exc)
        return BuildResult(None, f"{type(exc).__name__}: {exc}" if host is None else host,
                           time.perf_counter() - start, host is not None, tuple(phases))
    result = _built[key] = BuildResult(lib, None, time.perf_counter() - start, False,
                                       tuple(phases))
    if len(_built) > BUILD_CACHE_SIZE:
        _built.popitem(last=False)
    if persist:
        _disk_put(key, lib)
    return result


def keep(ir_text: str, mcpu: str | None, library: bytes, persist: bool = True) -> None:
    """Remember a library built for `ir_text` elsewhere (a build child) as build(...,
    persist) would have: in memory, and on disk with `persist`."""
    key = _key(ir_text, mcpu)
    _built[key] = BuildResult(library, None, 0.0)
    if persist:
        _disk_put(key, library)


def is_built(ir_text: str, mcpu: str | None, persist: bool = False) -> bool:
    """Whether build(ir_text, mcpu, persist) would find its library built (in this
    process, or with `persist` on disk) rather than build it."""
    key = _key(ir_text, mcpu)
    if key in _built:
        return True
    path = _disk_path(key) if persist else None
    return path is not None and path.exists()


def _key(ir_text: str, mcpu: str | None) -> tuple[bytes, str | None]:
    return hashlib.sha256(ir_text.encode()).digest(), mcpu


def _disk_path(key: tuple[bytes, str | None]):
    """Where a library lives on disk: named by its IR, the CPU it is built for (the host's
    name and features when none is named: a shared home may serve several machines),
    llvmlite, the passes and the link command."""
    from raytune_kernels.cache import cache_dir

    root = cache_dir()
    if root is None:
        return None
    import llvmlite

    name = hashlib.sha256(key[0] + json.dumps([key[1], host_cpu(), llvmlite.__version__,
                                               linker()[:1] + LINK, IR_PASSES,
                                               CODEGEN_OPTIONS]).encode()
                          ).hexdigest()
    return root / "libraries" / f"{name}.so"


def _disk_get(key) -> bytes | None:
    path = _disk_path(key)
    try:
        data = path.read_bytes() if path is not None else None
    except OSError:
        return None
    return data if data and data.startswith(b"\x7fELF") else None


def _disk_put(key, library: bytes, only_new: bool = False) -> None:
    """Write it whole under a temp name, then rename: a reader never sees half a file. A
    cache that cannot be written (a read-only or full home) only costs a rebuild.
    `only_new`: leave a library already there as it is."""
    path = _disk_path(key)
    if path is None or (only_new and path.exists()):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(library)
        os.replace(tmp, path)
    except OSError:
        return


_built: "collections.OrderedDict[tuple[bytes, str | None], BuildResult]" = \
    collections.OrderedDict()


@functools.lru_cache(maxsize=1)
def permit_amx() -> bool:
    """Ask Linux, once, for this process's AMX tile data state (arch_prctl
    ARCH_REQ_XCOMP_PERM for XTILEDATA): without it an AMX instruction faults. True once
    granted; False where refused or not Linux."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    arch_prctl, req_xcomp_perm, xtiledata = 158, 0x1023, 18
    return libc.syscall(arch_prctl, req_xcomp_perm, xtiledata) == 0


class LoadedKernel:
    """A shared library loaded from bytes, exposing one kernel function."""

    def __init__(self, library: bytes, name: str, n_buffers: int):
        start = time.perf_counter()
        self.library, self.name, self.n_buffers = library, name, n_buffers
        # named by this process, so that one killed mid-measurement (a crashing candidate:
        # SIGSEGV skips every cleanup) can be swept by the next (sweep_stale_dirs)
        self._dir = tempfile.TemporaryDirectory(prefix=f"rk_load_{os.getpid()}_")
        path = os.path.join(self._dir.name, f"{name}.so")
        with open(path, "wb") as f:
            f.write(library)
        if name.endswith("_amx") and not permit_amx():  # tiles need the AMX state first
            raise RuntimeError(f"kernel {name} runs on AMX tiles, and this process was "
                               "refused their state (arch_prctl XTILEDATA)")
        self._lib = ctypes.CDLL(path)
        self.fn = getattr(self._lib, name)
        self.fn.argtypes = [ctypes.c_void_p] * n_buffers + [ctypes.c_int32]
        self.fn.restype = None
        self.load_s = time.perf_counter() - start  # writing the .so and dlopen

    def __call__(self, pointers: list[int], threads: int) -> None:
        self.fn(*pointers, threads)

    def __reduce__(self):
        """Pickled as its library's bytes, loaded again where it is unpickled (a saved
        network: compile/artifact.py)."""
        return LoadedKernel, (self.library, self.name, self.n_buffers)


def sweep_stale_dirs() -> int:
    """Remove the load and build directories (rk_load_PID_*, rk_build_PID_*) of processes
    that no longer exist; returns how many. Measurer actors call it when they start, so a
    run whose candidates crash measurers does not fill the temp directory."""
    import glob
    import re
    import shutil

    removed = 0
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "rk_*_*_*")):
        match = re.fullmatch(r"rk_(?:load|build)_(\d+)_.*", os.path.basename(path))
        if not match or _alive(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += not os.path.exists(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


HUGE = 2 << 20  # bytes: an x86-64 huge page


def _huge_raw(n: int, advise: bool = True) -> np.ndarray | None:
    """n floats starting on a huge-page boundary, in memory the kernel is asked to back
    with huge pages (this machine's transparent huge pages may be `madvise` only); None
    where the OS offers no such advice. Not `advise`: the caller advises them itself
    (advise_huge), once it has filled them."""
    import mmap
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    size = n * 4 + HUGE
    size += -size % HUGE
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(mm, np.float32)  # holds the mapping: unmapped with the array
    start = (-raw.ctypes.data % HUGE) // 4
    if advise:
        advise_huge(raw[start: start + n])
    return raw[start: start + n]


def advise_huge(array: np.ndarray, collapse: bool = False) -> None:
    """Ask for huge pages behind `array` (a view of _huge_raw's mapping, from its start).
    With `collapse`, have the pages it already filled merged into them now (MADV_COLLAPSE,
    Linux 6.1+), not whenever khugepaged comes by: a network compiled a moment ago ran on
    small pages, untuned ResNet-18 1.18x and ViT-B/16 1.10x slower (2 threads,
    interleaved), and two compiles of the same kernels differed by as much."""
    import mmap

    base = array
    while isinstance(base, np.ndarray):  # down to the buffer the mapping exports
        base = base.base
    mm = base.obj if isinstance(base, memoryview) else base
    start = array.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data
    try:
        mm.madvise(mmap.MADV_HUGEPAGE, start, len(mm) - start)
    except (OSError, ValueError):  # a kernel without transparent huge pages: plain pages
        return
    if not collapse:
        return
    try:
        mm.madvise(MADV_COLLAPSE, start, len(mm) - start)
    except (OSError, ValueError):  # an older kernel, or no huge page free: merged later
        pass


MADV_COLLAPSE = 25  # <linux/mman.h>; Python's mmap names it from 3.12


def aligned(flat: np.ndarray, fault_small: bool = False) -> np.ndarray:
    """A 64-byte aligned copy of a flat float32 array. Arrays of a huge page or more (conv
    weights, activations, workspaces) start on a huge page, in memory advised for huge
    pages: streaming a layer's cold weights then walks a page table 512x smaller (ResNet-18
    layer4 convs with rotating cold weights, 2 threads, interleaved: 2-6% faster).
    `fault_small`: the copy is written into small pages, advised for huge ones only
    after, and collapsed into them at once where the kernel can (advise_huge): on a
    virtual machine the first touch of a huge page can cost milliseconds (a BERT-base's
    packed weights, 358 MB: 1.28 s faulted as huge pages, 0.25 s as small ones)."""
    big = flat.size * 4 >= HUGE
    raw = _huge_raw(flat.size + ALIGN // 4, advise=not fault_small) if big else None
    out = _aligned_in(raw, flat.size)
    out[:] = flat
    if raw is not None and fault_small:
        advise_huge(raw, collapse=True)
    return out


def aligned_empty(n: int) -> np.ndarray:
    """n uninitialised floats placed as aligned() places a copy (the caller fills them)."""
    return _aligned_in(_huge_raw(n + ALIGN // 4) if n * 4 >= HUGE else None, n)


def _aligned_in(raw: np.ndarray | None, n: int) -> np.ndarray:
    """n floats of `raw` (or of a new array) from its first 64-byte boundary."""
    if raw is None:
        raw = np.empty(n + ALIGN // 4, np.float32)
    off = (-raw.ctypes.data % ALIGN) // 4
    return raw[off: off + n]
