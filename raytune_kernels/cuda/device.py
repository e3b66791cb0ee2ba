"""The one place that touches CuPy and the CUDA device: the cupy import, device queries,
sticky-error rules, loaded kernels and their launches, CUDA-event timing, the L2 flush,
and torch's true-float32 mode. Everything is imported and touched inside functions, so
this module imports on machines without cupy or a GPU."""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import tempfile
from typing import Callable

import torch

from raytune_kernels.cuda.kernel import CudaKernel
from raytune_kernels.measure import rotating_copies


def has_cupy() -> bool:
    return importlib.util.find_spec("cupy") is not None


# CUDA errors after which the context is corrupt (the same codes in the driver and runtime
# APIs): launch timeout, device assert, stack error, illegal instruction, misaligned
# address, invalid address space, invalid PC, launch failure, illegal address.
STICKY_ERRORS = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})
POISONED = "CUDA context poisoned"


def cupy():
    """The cupy module, imported here only: a heavy optional dependency, used only where
    a GPU is."""
    import cupy as cp

    return cp


def gpu_count() -> int:
    """CUDA devices visible to this process; 0 without cupy, a driver or a GPU."""
    try:
        return int(cupy().cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def device_arch(device: int = 0) -> str:
    """The NVRTC arch of a device, "sm_XY" for compute capability X.Y (what builders
    target)."""
    return f"sm_{cupy().cuda.Device(device).compute_capability}"


def device_name(device: int = 0) -> str:
    """The product name of a device, as the CUDA driver reports it."""
    name = cupy().cuda.runtime.getDeviceProperties(device)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def is_sticky(exc: BaseException) -> bool:
    """Whether a CUDA error leaves the context unusable (the process must end)."""
    status = getattr(exc, "status", None)
    return status in STICKY_ERRORS or "illegal memory access" in str(exc)


class LoadedCudaKernel:
    """A cupy RawKernel loaded from cubin or PTX bytes (cubins are ELF files). The file
    RawModule reads stays until this object goes, in case cupy loads it lazily."""

    def __init__(self, binary: bytes, name: str):
        cp = cupy()
        self._dir = tempfile.TemporaryDirectory(prefix="rk_cuda_")
        path = os.path.join(self._dir.name, name + (".cubin" if binary[:4] == b"\x7fELF"
                                                    else ".ptx"))
        with open(path, "wb") as f:
            f.write(binary)
        self.module = cp.RawModule(path=path)
        self.fn = self.module.get_function(name)


class Launch:
    """One kernel with its device buffers: call it to enqueue a launch."""

    def __init__(self, kernel: CudaKernel, loaded: LoadedCudaKernel, arrays):
        cp = cupy()
        self.kernel, self.loaded, self.fn = kernel, loaded, loaded.fn
        self.buffers = [cp.asarray(a) for a in arrays]
        self.buffers[-1].fill(float("nan"))

    def __call__(self) -> None:
        k = self.kernel
        self.fn(k.grid, k.block, tuple(self.buffers), shared_mem=k.smem_bytes)

    def output(self):
        return cupy().asnumpy(self.buffers[-1])

    def rotating(self, index: int, copies: int) -> Callable[[], None]:
        """rotating_call over this launch's buffers."""
        return rotating_call(self.fn, self.kernel, tuple(self.buffers), index, copies)


def rotating_call(fn, kernel: CudaKernel, args: tuple, index: int, copies: int
                  ) -> Callable[[], None]:
    """A call that launches `kernel` (through its loaded `fn`) on `args`, argument `index`
    replaced in turn by each of `copies` copies of it (the first: the argument itself): a
    graph of such calls reads that buffer from memory, not from the L2 the previous
    launch left it in."""
    turns = [args] + [args[:index] + (args[index].copy(),) + args[index + 1:]
                      for _ in range(copies - 1)]
    turn = itertools.count()
    return lambda: fn(kernel.grid, kernel.block, turns[next(turn) % len(turns)],
                      shared_mem=kernel.smem_bytes)


def event_timer(launch, cp):
    """run(number): seconds for `number` back-to-back calls from Python, by CUDA events:
    for work that is itself one graph's replay, and for what users run as launched
    (eager PyTorch). A kernel of ours is timed replayed from a graph (graph_timer)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def run(number: int) -> float:
        start.record()
        for _ in range(number):
            launch()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3
    return run


# launches one captured graph holds: a longer run replays it, so a candidate's timing
# captures a few hundred launches rather than every launch of every repeat's length (a
# cupy launch costs the host microseconds to capture, and ~1200 were captured for a
# 10 us kernel's 10 ms repeats); a multiple of every count of weight copies (weight_copies)
GRAPH_UNIT = 256


def weight_copies(nbytes: int, cache_bytes: int) -> int:
    """How many rotating copies of a kernel's weights of `nbytes` its cold launches cycle
    through on a GPU: measure.rotating_copies' (together at least twice the cache, at most
    256) rounded up to a power of two, so that a graph of GRAPH_UNIT launches holds whole
    cycles and, replayed back to back, reads each copy as long after its last read as any
    other."""
    copies = rotating_copies(nbytes, 2 * cache_bytes)
    return min(GRAPH_UNIT, 1 << (copies - 1).bit_length())


def graph_timer(capture: Callable[[int], Callable[[], object]], cp, unit: int = GRAPH_UNIT):
    """run(number): seconds for `number` calls replayed from CUDA graphs, by CUDA events
    on the current stream. `capture(n)` records n calls once and returns a replay
    (launch_graph for cupy kernels, torch_timing.graphed_capture for torch work); `number`
    calls are number // unit replays of one graph of `unit` calls, then one graph of the
    rest, each graph captured once for the timer's life and enqueued back to back (a
    replay of `unit` kernels outlasts the host's enqueue of the next). A compiled network
    replays its steps from one graph (compile/cuda_network.py), with no host work between
    kernels; timed in a loop of launches from Python instead, a kernel shorter than the
    host's time to issue a launch (several microseconds) would measure that rate, not
    itself."""
    graphs: dict[int, Callable[[], object]] = {}
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def graph(n: int) -> Callable[[], object]:
        if n not in graphs:
            graphs[n] = capture(n)
        return graphs[n]

    def run(number: int) -> float:
        whole, rest = divmod(number, unit)
        # a graph is captured only where it is replayed: capturing `unit` calls for a
        # shorter run would hold (and on a GPU, record) work that never runs
        replays = ([graph(unit)] * whole if whole else []) + ([graph(rest)] if rest else [])
        start.record()
        for replay in replays:
            replay()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3
    return run


def launch_graph(launch: Callable[[], None], cp) -> Callable[[int], Callable[[], object]]:
    """capture(number) for graph_timer: `number` calls of `launch` (cupy kernel launches
    on the current stream) recorded on a capture stream of their own, replayed on the
    current stream. Launch once before: a module's first launch loads it, which a capture
    cannot hold."""
    def capture(number: int) -> Callable[[], object]:
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                for _ in range(number):
                    launch()
            finally:
                graph = stream.end_capture()
        return graph.launch
    return capture


def l2_bytes(cp) -> int:
    """The current device's L2 cache, in bytes."""
    return int(cp.cuda.Device().attributes.get("L2CacheSize", 50 << 20))


def l2_flusher(cp):
    """Writes a buffer twice the L2's size: the next repeat starts with a cold L2."""
    size = l2_bytes(cp) * 2
    buf = cp.zeros(max(size // 4, 1 << 20), dtype=cp.float32)

    def flush() -> None:
        cp.add(buf, 1.0, out=buf)
    return flush


@contextlib.contextmanager
def torch_gpu_mode(benchmark: bool = True):
    """TF32 off for cuBLAS and cuDNN (true float32), cudnn.benchmark as asked; the old
    settings come back on exit."""
    b = torch.backends
    old = b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark
    b.cuda.matmul.allow_tf32 = b.cudnn.allow_tf32 = False
    b.cudnn.benchmark = benchmark
    try:
        yield
    finally:
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark = old
