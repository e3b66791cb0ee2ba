"""An emulated GPU for tests: runs a GpuPlan's launches through the CPU CUDA emulator
(tests/support/cuda_emulate.py) on a CPU arena, so the plan (kernels, packed weights, offsets,
launch order, torch steps) is checked for real without a GPU. Verification only: it
compiles a C++ program per launch and is far too slow to run a network for a user."""
from __future__ import annotations

import itertools
import time
from typing import Callable

import numpy as np
import torch

from tests.support.cuda_emulate import emulate
from raytune_kernels.compile.cuda_plan import Const, GBuf, GpuPlan, GpuStep


class EmulatorDevice:
    """The Device protocol on the CPU: the arena and constants are CPU tensors; a launch
    copies its operands out (the emulator takes exact-size arrays, ASan guarding their
    ends) and its output back into the arena, as the kernel would have written it."""

    # what the layout choice weighs, made up: tests set the figures a plan must weigh
    transform_s = 5e-6
    torch_s = 1e-3

    @classmethod
    def transform_seconds(cls, shape, src: str, dst: str) -> float:
        return cls.transform_s

    @classmethod
    def torch_seconds(cls, compute) -> float:
        return cls.torch_s

    def __init__(self, plan: GpuPlan):
        self.arena = torch.full((max(plan.arena_floats, 1),), float("nan"))
        self.consts = [torch.from_numpy(c.copy()) for c in plan.consts]
        self.launches = 0
        self.captures = 0
        self.weight_copies_read: set[int] = set()

    def tensor(self, buf: GBuf) -> torch.Tensor:
        return self.arena[buf.offset: buf.offset + buf.size]

    def constant(self, const: Const) -> torch.Tensor:
        return self.consts[const.index]

    # the cache a profile's cold weights are read past, made up: a few copies of a test's
    # small weights cover twice it
    l2 = 1 << 14

    @classmethod
    def cache_bytes(cls) -> int:
        return cls.l2

    def kernel_call(self, step: GpuStep, weights_copies: int = 1) -> Callable[[], None]:
        out = self.tensor(step.out)
        weights = [None] + [self._flat(step.operands[1]).copy()
                            for _ in range(weights_copies - 1)]
        turn = itertools.count()

        def call() -> None:
            arrays = [self._flat(o) for o in step.operands]
            w = weights[next(turn) % len(weights)]
            if w is not None:  # this launch's copy of the weights
                arrays[1] = w
                self.weight_copies_read.add(id(w))
            arrays.append(np.empty(step.out.size, np.float32))
            out.copy_(torch.from_numpy(emulate(step.kernel, arrays).copy()))
            self.launches += 1
        return call

    def _flat(self, o) -> np.ndarray:
        t = self.constant(o) if isinstance(o, Const) else self.tensor(o)
        return t.reshape(-1).numpy().astype(np.float32)

    def capture(self, run: Callable[[], None]) -> Callable[[], None]:
        """The emulator has no graphs: a replay runs the steps as they were launched (what
        a graph replays), and the captures are counted for the tests."""
        self.captures += 1
        return run

    def graph_timer(self, run: Callable[[], None]) -> Callable[[int], float]:
        """timer(); each number of calls asked is counted as a capture, once, as a GPU's
        graph_timer captures each once."""
        clock, captured = self.timer(run), set()

        def replayed(number: int) -> float:
            if number not in captured:
                captured.add(number)
                self.captures += 1
            return clock(number)
        return replayed

    def timer(self, run: Callable[[], None]) -> Callable[[int], float]:
        def clock(number: int) -> float:
            start = time.perf_counter()
            for _ in range(number):
                run()
            return time.perf_counter() - start
        return clock
