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
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from raytune_kernels.cpu.build import LoadedKernel, build
from raytune_kernels.errors import CompileError

NAME = "rk_run"


def runner_ir(arities: Sequence[int]) -> str:
    """IR text of the runner for kernels taking arities[i] pointer arguments each (then
    the thread count, passed on to every kernel)."""
    lines = [f"define void @{NAME}(ptr %table, i32 %threads) {{",
             "entry:"]
    slot = 0
    for i, n in enumerate(arities):
        names = [f"%f{i}"] + [f"%a{i}_{k}" for k in range(n)]
        for k, value in enumerate(names):
            lines.append(f"  %p{i}_{k} = getelementptr inbounds i64, ptr %table, "
                         f"i64 {slot + k}")
            lines.append(f"  {value} = load ptr, ptr %p{i}_{k}, align 8")
        args = ", ".join([f"ptr {a}" for a in names[1:]] + ["i32 %threads"])
        lines.append(f"  call void {names[0]}({args})")
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

    def __post_init__(self) -> None:
        self._args = (ctypes.c_void_p(self.table.ctypes.data), ctypes.c_int32(self.threads))

    def __call__(self) -> None:
        self.loaded.fn(*self._args)


def make_runner(calls: Sequence[tuple[ctypes._CFuncPtr, Sequence[int]]],
                threads: int) -> Runner:
    """The runner of `calls` (each a kernel function and its pointer arguments, as
    addresses): its IR built (or found on disk) and loaded, its table filled."""
    words = [w for fn, pointers in calls for w in (address(fn), *pointers)]
    ir = runner_ir([len(p) for _, p in calls])
    built = build(ir, persist=True)
    if built.error:
        raise CompileError(f"the network's native runner did not build: {built.error}")
    return Runner(np.array(words, dtype=np.uint64), [fn for fn, _ in calls],
                  LoadedKernel(built.library, NAME, 1), threads, ir)
