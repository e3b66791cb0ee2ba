"""A run of native kernels in one native call: the runner a compiled network calls.

A compiled network is a list of native calls (kernels and layout transforms) with, here
and there, a PyTorch step. Calling each kernel from Python costs a ctypes call and a turn
of the interpreter's loop per step (~0.5 us), between kernels whose OpenMP
workers spin waiting for the next parallel region; MobileNetV2 has ~100 steps. A runner
is one function, `void rk_run(ptr table, i32 nthreads)`, that calls every kernel of a
run of consecutive native steps in order, reading each one's address and arguments from
a table of 64-bit words: [kernel, arg, arg, ..., kernel, arg, ...]. Its IR depends only on
how many arguments each kernel takes, so the same runner serves every network with the
same arities (built once, kept on disk like the kernels); the addresses live in the table,
which the network owns with the buffers they point to.

A clocked runner (`Runner.clocked()`, for profiling) is the same calls with the cycle
counter read before the first and after each one, `void rk_run_clocked(ptr table, ptr
clock, i32 nthreads)` writing one 64-bit stamp per read: each kernel timed as the network
runs it, with no Python between kernels.
"""
from __future__ import annotations

import ctypes
import functools
import platform
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from raytune_kernels.cpu.build import LoadedKernel, build
from raytune_kernels.errors import CompileError

NAME = "rk_run"
CLOCKED = "rk_run_clocked"


def runner_ir(arities: Sequence[int], clocked: bool = False) -> str:
    """IR text of the runner for kernels taking arities[i] pointer arguments each (then
    the thread count, passed on to every kernel); `clocked`: the clocked runner."""
    if clocked:
        lines = ["declare i64 @llvm.readcyclecounter()",
                 f"define void @{CLOCKED}(ptr %table, ptr %clock, i32 %threads) {{", "entry:"]
    else:
        lines = [f"define void @{NAME}(ptr %table, i32 %threads) {{", "entry:"]

    def stamp(k: int) -> None:
        if clocked:
            lines.extend([f"  %t{k} = call i64 @llvm.readcyclecounter()",
                          f"  %c{k} = getelementptr inbounds i64, ptr %clock, i64 {k}",
                          f"  store i64 %t{k}, ptr %c{k}, align 8"])
    stamp(0)
    slot = 0
    for i, n in enumerate(arities):
        names = [f"%f{i}"] + [f"%a{i}_{k}" for k in range(n)]
        for k, value in enumerate(names):
            lines.append(f"  %p{i}_{k} = getelementptr inbounds i64, ptr %table, "
                         f"i64 {slot + k}")
            lines.append(f"  {value} = load ptr, ptr %p{i}_{k}, align 8")
        args = ", ".join([f"ptr {a}" for a in names[1:]] + ["i32 %threads"])
        lines.append(f"  call void {names[0]}({args})")
        stamp(i + 1)
        slot += n + 1
    lines += ["  ret void", "}", ""]
    return "\n".join(lines)


def address(fn: ctypes._CFuncPtr) -> int:
    """The machine address of a loaded kernel function."""
    return ctypes.cast(fn, ctypes.c_void_p).value


@dataclass(eq=False)
class Runner:
    """Calls the kernels `table` names (each its address, then its pointer arguments)
    in order, in one native call of `loaded`; `threads` goes to every kernel."""

    table: np.ndarray
    kernels: list  # the kernel functions, kept alive with their libraries' owners
    loaded: LoadedKernel
    threads: int
    ir: str = ""  # the runner's LLVM IR (a saved network carries its library by it)
    arities: tuple[int, ...] = ()  # pointer arguments of each call, in order

    def __post_init__(self) -> None:
        self._args = (ctypes.c_void_p(self.table.ctypes.data), ctypes.c_int32(self.threads))
        self._clocked: LoadedKernel | None = None

    def __call__(self) -> None:
        self.loaded.fn(*self._args)

    def clocked(self) -> Callable[[], np.ndarray]:
        """A call of the same kernels that returns the cycle counter's reading before the
        first and after each one (len(arities) + 1 stamps); built on first use."""
        if self._clocked is None:
            built = build(runner_ir(self.arities, clocked=True), persist=True)
            if built.error:
                raise CompileError(f"the clocked runner did not build: {built.error}")
            self._clocked = LoadedKernel(built.library, CLOCKED, 2)
        stamps = np.zeros(len(self.arities) + 1, dtype=np.uint64)
        args = (ctypes.c_void_p(self.table.ctypes.data), ctypes.c_void_p(stamps.ctypes.data),
                ctypes.c_int32(self.threads))
        fn = self._clocked.fn

        def run() -> np.ndarray:
            fn(*args)
            return stamps
        return run


def make_runner(calls: Sequence[tuple[ctypes._CFuncPtr, Sequence[int]]],
                threads: int) -> Runner:
    """The runner of `calls` (each a kernel function and its pointer arguments, as
    addresses): its IR built (or found on disk) and loaded, its table filled."""
    words = [w for fn, pointers in calls for w in (address(fn), *pointers)]
    arities = tuple(len(p) for _, p in calls)
    ir = runner_ir(arities)
    built = build(ir, persist=True)
    if built.error:
        raise CompileError(f"the network's native runner did not build: {built.error}")
    return Runner(np.array(words, dtype=np.uint64), [fn for fn, _ in calls],
                  LoadedKernel(built.library, NAME, 1), threads, ir, arities)


@functools.cache
def cycles_per_second() -> float | None:
    """The rate of the counter a clocked runner reads, measured against perf_counter over
    20 ms; None where it is not a constant-rate user-readable counter (LLVM reads the
    time-stamp counter on x86; elsewhere it may be a register user code cannot read)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    ir = ("declare i64 @llvm.readcyclecounter()\n"
          "define i64 @rk_cycles() {\n  %t = call i64 @llvm.readcyclecounter()\n"
          "  ret i64 %t\n}\n")
    built = build(ir, persist=True)
    if built.error:
        raise CompileError(f"the cycle counter's reader did not build: {built.error}")
    loaded = LoadedKernel(built.library, "rk_cycles", 0)
    read = loaded.fn
    read.argtypes, read.restype = [], ctypes.c_uint64
    c0, t0 = read(), time.perf_counter()
    while time.perf_counter() - t0 < 0.02:
        pass
    c1, t1 = read(), time.perf_counter()
    return (c1 - c0) / (t1 - t0) if c1 > c0 else None
