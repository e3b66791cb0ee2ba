"""compile_network(): a tuned network as one callable that takes and returns torch tensors.

1. Capture and partition the model: the same tasks the tuner saw.
2. Candidates per step: the best record per layout pair (and, with fallback="torch",
   PyTorch's own kernel at its measured time). The layout ILP picks one per step, with
   edges costed by measured transform kernels, borders of windowed inputs included.
   From records, each step's best few records of the chosen layouts are then clocked
   inside the running network and the fastest as it runs is kept; then the steps whose
   threads split channels get records that split rows instead, where the network runs
   faster with its threads reading what they wrote (compile/refine.py).
3. Build the chosen kernels, pack weights once, plan buffers (a buffer is reused once its
   value is dead, by any later value; a bordered buffer whose memory other values share
   gets its border written again before its writer), and run each stretch of native calls
   (kernels, transforms, border fills) as one call of a native runner (cpu/runner.py).
4. Check against the model at compile time; benchmark and profile on demand.

The plan itself (buffers, calls, the planner, buffer reuse) is made in compile/cpu_plan.py.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import itertools
import json
import math
import random
import time
import warnings
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from raytune_kernels.compile.artifact import cpu_machine, graph_without_weights, save
from raytune_kernels.compile.choose import (TORCH, Solver, candidates_from_records, choose,
                                            estimated_latency, layout_family, prune,
                                            step_problem)
from raytune_kernels.compile.cpu_plan import (Buf, Planner, Step, allocate, borders_wanted,
                                              nhwc_reads, transform_cost, transforms_asked)
from raytune_kernels.compile.report import (Profile, ProfileRow, Reporting, held_to,
                                             output_error, random_inputs, scaled_error)
from raytune_kernels.cpu.amx import precision_problem
from raytune_kernels.cpu.probe import CHECK_CHILD, start_child, unusable_mcpu
from raytune_kernels.cpu.contraction import contraction
from raytune_kernels.cpu.lower import operand_kinds
from raytune_kernels.cpu.row_kernels import ROW_OPS
from raytune_kernels.cpu.border import border_runs, fill_ir, fill_kernel
from raytune_kernels.cpu.build import ALIGN, build, keep
from raytune_kernels.cpu.runner import Runner, cycles_per_second, make_runner
from raytune_kernels.cpu.estimate import cycles
from raytune_kernels.cpu.machine import CpuInfo, cpu_info
from raytune_kernels.cpu.measure import cold_copies
from raytune_kernels.cpu.schedules import (lower, nhwc_reader, no_kernel_reason,
                                           prefetch_twin, rows_first_twin, space_for,
                                           writes_bordered)
from raytune_kernels.cpu.transform import Layout
from raytune_kernels.errors import CompileError
from raytune_kernels.frontend.capture import capture
from raytune_kernels.precision import DEFAULT
from raytune_kernels.layout.problem import LayoutPlan, solve_ilp
from raytune_kernels.layout.costs import layouts_of, measure_transforms
from raytune_kernels.layout.graph import NCHW, Candidate
from raytune_kernels.measure import MeasureOptions, random_operands
from raytune_kernels.frontend.partition import (GlueStep, Partition, TaskStep, partition,
                                                 run_glue, run_steps)
from raytune_kernels.space import Config, completed, describe_tuned_before, tuned_before_knobs
from raytune_kernels.task import Task
from raytune_kernels.tune.records import Record, best_per_task
from raytune_kernels.frontend.reference import reference
from raytune_kernels.target import Target, parse_target
from raytune_kernels.timing import TimingOptions, median, time_fn


# -------------------------------------------------------------------------- the network

class CompiledNetwork(Reporting):
    """A network compiled from tuning records. Call it like the model."""

    def __init__(self, part: Partition, steps: list[Step], inputs: list[Buf],
                 outputs: list[Buf], threads: int, plan: LayoutPlan | None, estimated_s: float,
                 value_of: dict[int, tuple[str, str]],
                 aliases: list[Buf] = ()):
        self.part, self.graph, self.steps, self.threads = part, part.graph, steps, threads
        self.value_of = value_of
        self.plan, self.estimated_s = plan, estimated_s
        self._in, self._out, self._aliases = inputs, outputs, list(aliases)
        self._arrays, refill = allocate(steps, inputs + outputs, aliases)
        self._in_views = [self.view(b) for b in inputs]
        self._out_views = [self.view(b) for b in outputs]
        self._fills = self._border_fills(refill)  # step index -> native calls before it
        self._bound = [self._bind(s) for s in steps]
        # one per step, its border fills included: profile() clocks them
        self._calls = [self._with_fills(i, call) for i, call in enumerate(self._bound)]
        self._owners: list[list[int]] = []  # per segment, the step of each of its calls
        self._segments = self._native_runs()  # what _run() calls
        # the words of the native calls that hold each input's address, where a call can
        # point them at the caller's tensor instead of copying it in (None: copied)
        self._in_slots = [self._direct_slots(b, inputs + outputs) for b in inputs]

    def view(self, b: Buf) -> torch.Tensor:
        """A plain buffer as a torch tensor sharing its memory."""
        return torch.from_numpy(self._arrays[id(b)][: b.size]).view(b.shape)

    def _pointers(self, s: Step) -> list[int]:
        return [(self._arrays[id(o)] if isinstance(o, Buf) else o).ctypes.data
                for o in s.operands]

    def _bind(self, s: Step) -> tuple[Callable, tuple]:
        if s.kernel is not None:
            args = tuple(ctypes.c_void_p(p) for p in self._pointers(s))
            return s.kernel.fn, args + (ctypes.c_int32(self.threads),)
        ins = [self.view(o) if isinstance(o, Buf) else o for o in s.operands]
        out, fn = self.view(s.writes[0]), s.fn
        if s.into is not None:
            return s.into, (out, *ins)

        def call() -> None:
            out.copy_(fn(*ins))
        return call, ()

    def _border_fills(self, refill: list[tuple[Buf, int]]
                      ) -> dict[int, list[tuple[Callable, list[int]]]]:
        """For each bordered buffer whose memory other values share, the native call that
        writes its border again (where they overwrite it), placed before the step that
        writes the buffer."""
        writer = {}
        for i, s in enumerate(self.steps):
            for b in s.writes:
                writer.setdefault(id(b), i)
        self._runs = [border_runs(b.layout, b.shape, below) for b, below in refill]  # alive
        self._fill_values = sorted({b.border for b, _ in refill})
        fills: dict[int, list[tuple[Callable, list[int]]]] = {}
        for (b, _), runs in zip(refill, self._runs):
            call = (fill_kernel(b.border).fn, [self._arrays[id(b)].ctypes.data, runs.ctypes.data])
            fills.setdefault(writer[id(b)], []).append(call)
        return fills

    def _with_fills(self, i: int, call: tuple[Callable, tuple]) -> tuple[Callable, tuple]:
        if i not in self._fills:
            return call
        fills = [(fn, tuple(ctypes.c_void_p(p) for p in ptrs) + (ctypes.c_int32(1),))
                 for fn, ptrs in self._fills[i]]
        fn, args = call

        def filled() -> None:
            for f, a in fills:
                f(*a)
            fn(*args)
        return filled, ()

    def _native_runs(self) -> list[tuple[Callable, tuple]]:
        """The steps as _run() calls them: each run of two or more consecutive native calls
        (kernels, transforms, border fills) as one call of a native Runner, PyTorch steps
        (and lone native calls) as bound."""
        out: list[tuple[Callable, tuple]] = []
        run: list[tuple[Callable, list[int]]] = []
        owners: list[int] = []

        def flush() -> None:
            if len(run) > 1:
                out.append((make_runner(run, self.threads), ()))
            elif run:
                fn, ptrs = run[0]
                out.append((fn, tuple(ctypes.c_void_p(p) for p in ptrs)
                             + (ctypes.c_int32(self.threads),)))
            if run:
                self._owners.append(list(owners))
            run.clear()
            owners.clear()
        for i, s in enumerate(self.steps):
            fills = self._fills.get(i, ())
            run.extend(fills)
            owners.extend([i] * len(fills))
            if s.kernel is not None:
                run.append((s.kernel.fn, self._pointers(s)))
                owners.append(i)
                continue
            flush()
            out.append(self._bound[i])
            self._owners.append([i])
        flush()
        return out

    def __call__(self, *inputs: torch.Tensor):
        """The outputs for `inputs`. The native calls read an input where the caller's
        tensor lies where the plan allows (_direct_slots) and the tensor is laid out as
        they read it (_handed_over); any other input is copied in first. Outputs are
        copied out. Every step between runs is slow: the run leaves the caches holding
        the network's data, not the interpreter's or PyTorch's, and a copy of
        MobileNetV2's input took 0.10-0.15 ms at 2 threads where it takes a few
        microseconds warm."""
        if len(inputs) != len(self._in):
            raise ValueError(f"expected {len(self._in)} input(s), got {len(inputs)}")
        for x, view, (name, _) in zip(inputs, self._in_views, self.graph.inputs):
            if tuple(x.shape) != tuple(view.shape):
                raise ValueError(f"input {name}: shape {tuple(x.shape)}, compiled for "
                                 f"{tuple(view.shape)}")
        patched = []
        with torch.no_grad():
            for x, view, slots in zip(inputs, self._in_views, self._in_slots):
                if slots is not None and _handed_over(x):
                    address = x.data_ptr()
                    for word, _ in slots:
                        word.value = address
                    patched.append(slots)
                else:
                    view.copy_(x)
            try:
                self._run()
            finally:
                for slots in patched:
                    for word, rest in slots:
                        word.value = rest
            outs = [v.clone() for v in self._out_views]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _direct_slots(self, b: Buf, pinned: list[Buf]) -> list | None:
        """Where the native calls hold the address of graph input `b`: per word, a ctypes
        integer over it and the address it holds at rest, so that a call of the network
        can point them at the caller's tensor for one run. None where the input must be
        copied in: a bordered buffer or one of more floats than its elements (a kernel
        may read them), one a PyTorch step reads or any step writes (the caller's tensor
        is not ours to change), one that shares its memory with another input or output,
        one a border fill writes."""
        root = b.root
        if root.bordered or root.size != math.prod(b.shape) or \
                sum(p.root is root for p in pinned) > 1:
            return None
        for s in self.steps:
            if any(isinstance(o, Buf) and o.root is root for o in s.reads + s.operands) \
                    and s.kernel is None or any(o.root is root for o in s.writes):
                return None
        address = self._arrays[id(root)].ctypes.data
        if any(address in ptrs for fills in self._fills.values() for _, ptrs in fills):
            return None
        slots = []
        for fn, args in self._segments:
            if isinstance(fn, Runner):
                slots += [(ctypes.c_uint64.from_buffer(fn.table, 8 * int(k)), address)
                          for k in np.flatnonzero(fn.table == address)]
            else:
                slots += [(a, address) for a in args
                          if isinstance(a, ctypes.c_void_p) and a.value == address]
        return slots

    def _run(self) -> None:
        for fn, args in self._segments:
            fn(*args)

    def save(self, path: str) -> None:
        """Write the network to one file (compile/artifact.py): raytune_kernels.load(path)
        runs it in another process with neither Ray, XGBoost, PuLP nor the records."""
        save(path, self.state(), cpu_machine(self.mcpu))

    def state(self) -> dict:
        """What a saved file holds to build this network again: the plan and its machine
        code (the kernels' libraries travel inside their steps; the runners' and border
        fills' by their IR); the graph's own weights stay behind (the packed ones run)."""
        index = {id(s): i for i, s in enumerate(self.steps)}
        irs = [fn.ir for fn, _ in self._segments if isinstance(fn, Runner)]
        irs += [fill_ir(v) for v in self._fill_values]
        part = dataclasses.replace(self.part, graph=graph_without_weights(self.graph))
        return {"part": part, "steps": self.steps, "inputs": self._in,
                "outputs": self._out, "threads": self.threads, "plan": self.plan,
                "estimated_s": self.estimated_s, "aliases": self._aliases,
                "value_of": {index[k]: v for k, v in self.value_of.items()},
                "examples": self.examples, "mcpu": self.mcpu, "recorded": self.recorded,
                "native": {ir: build(ir, persist=True).library for ir in irs}}

    @classmethod
    def from_state(cls, state: dict) -> "CompiledNetwork":
        """The network of a saved state: nothing built but the buffers, nothing timed."""
        for ir, library in state["native"].items():
            keep(ir, None, library)
        steps = state["steps"]
        net = cls(state["part"], steps, state["inputs"], state["outputs"], state["threads"],
                  state["plan"], state["estimated_s"],
                  {id(steps[i]): v for i, v in state["value_of"].items()}, state["aliases"])
        net.examples, net.mcpu = state["examples"], state["mcpu"]
        net.recorded = state.get("recorded", frozenset())
        return net

    examples: "Sequence[torch.Tensor] | None" = None  # the inputs it was compiled with
    # compile/refine.py's reports: Refined, Agreed, Weighed, NhwcReads (None: not run)
    refined = None
    agreed = None
    weighed = None
    nhwc_reads = None
    # (task key, config) -> a kernel turned to read NHWC, timed against its original
    # before the layout plan took it: the ratio of their times (_timed_twins)
    twins_timed: dict | None = None
    mcpu: str | None = None  # the CPU its kernels were built for (None: the host)
    # the tasks whose kernels and estimates come from records (not the analytic model)
    recorded: frozenset = frozenset()

    def random_inputs(self, seed: int = 0) -> list[torch.Tensor]:
        """Random inputs of the compiled shapes (token ids in the examples' range)."""
        return self._random_inputs(seed)

    def _random_inputs(self, seed: int = 0) -> list[torch.Tensor]:
        return random_inputs([b.shape for b in self._in], self.examples, seed)

    def benchmark(self, opts: TimingOptions = TimingOptions(warmup=3, min_repeat_ms=200,
                                                            repeats=7)) -> float:
        """Median seconds per inference on random inputs: warm-up, repeats of at least
        min_repeat_ms, every repeat kept, the median (the measurers' protocol)."""
        xs = self._random_inputs()
        with torch.no_grad():
            return median(time_fn(lambda: self(*xs), opts))

    def profile(self, png: str | None = None, runs: int = 30, print_table: bool = True,
                opts: TimingOptions = TimingOptions(warmup=2, min_repeat_ms=10, repeats=5),
                with_torch: bool = True, end_to_end: float | None = None,
                cold_weights: bool = True) -> Profile:
        """Per-step times inside the running network (each step clocked as the network runs
        `runs` times, median), each step alone (repeated, as the records are timed: with
        `cold_weights`, the tuner's default, a conv's or dense's weights read from rotating
        copies, out of cache as in a network), and PyTorch's time for the same layer
        clocked the same way inside a run of the same graph in eager PyTorch (unless not
        `with_torch`: fidelity() needs ours only); prints the table, optionally saves a bar
        chart. `end_to_end`: benchmark() seconds the caller has already measured."""
        xs = self._random_inputs()
        end_to_end = self.benchmark() if end_to_end is None else end_to_end
        with torch.no_grad():
            ours = self._clock_steps(xs, runs)
            theirs, torch_total = self._clock_torch(xs, runs) if with_torch else ({}, 0.0)
            rows = []
            for i, (s, t) in enumerate(zip(self.steps, ours)):
                alone = median(time_fn(self._alone(i, cold_weights), opts))
                ref = theirs.get(s.name) if s.kind in ("kernel", "torch", "glue") else None
                flops = self.part.task(s.key).compute.flops() if s.key else 0
                rows.append(ProfileRow(s.name, s.kind, s.layers, t, alone, ref, s.estimate,
                                       flops, recorded=s.key in self.recorded))
        prof = Profile(rows, end_to_end, torch_total, self.peak_flops())
        if print_table:
            print(prof.table())
        if png:
            prof.save_png(png)
        return prof

    def peak_flops(self) -> float:
        """The CPU's peak floating-point operations per second at this network's threads,
        by its measured machine model: the best of its vector widths' FMAs per cycle x
        lanes x 2, times its clock and the threads."""
        machine = cpu_info(self.mcpu).machine
        per_cycle = max(u.fma_per_cycle * u.lanes * 2 for u in machine.units)
        return per_cycle * machine.ghz * 1e9 * self.threads

    def _alone(self, i: int, cold_weights: bool) -> Callable[[], None]:
        """Step i as a zero-argument call, its border fills included; with `cold_weights`,
        a conv's or dense's packed weights come from rotating copies that together cover
        twice the last-level cache, as cpu/measure.py times records. (Not its largest
        constant: a Winograd conv's workspaces are larger than its weights, and rotated,
        they made every such step look twice as slow alone as its record.)"""
        fn, args = self._calls[i]
        s = self.steps[i]
        k = s.weights
        if not cold_weights or k is None or isinstance(s.operands[k], Buf):
            return lambda: fn(*args)
        weights = s.operands[k]
        copies = [weights.copy() for _ in range(cold_copies(weights.nbytes))]
        kernel, kargs = self._bound[i]
        turns = itertools.cycle([kargs[:k] + (ctypes.c_void_p(c.ctypes.data),) + kargs[k + 1:]
                                 for c in copies])
        fills = [(f, tuple(ctypes.c_void_p(p) for p in ptrs) + (ctypes.c_int32(1),))
                 for f, ptrs in self._fills.get(i, ())]

        def cold() -> None:
            for f, a in fills:
                f(*a)
            kernel(*next(turns))
        cold.copies = copies  # the weights the turns point into live as long as the call
        return cold

    def _clock_steps(self, xs, runs: int) -> list[float]:
        """Each step's seconds inside the running network, median of `runs` runs: the
        network's own segments run in order, a native runner's kernels clocked by the
        cycle counter inside it (cpu/runner.py), any other segment by perf_counter around
        it; a step's border fills count as its own. Without such a counter, each step is
        called and clocked from here in turn (_clock_calls)."""
        per_second = cycles_per_second()
        if per_second is None:
            return self._clock_calls(xs, runs)
        clocked = [fn.clocked() if isinstance(fn, Runner) else None for fn, _ in self._segments]
        laps: list[list[float]] = [[] for _ in self.steps]
        for r in range(runs + 3):
            for x, view in zip(xs, self._in_views):
                view.copy_(x)
            took = [0.0] * len(self.steps)
            for (fn, args), run, owners in zip(self._segments, clocked, self._owners):
                if run is not None:
                    laps_s = np.diff(run().astype(np.int64)) / per_second
                    for i, t in zip(owners, laps_s):
                        took[i] += t
                else:
                    t = time.perf_counter()
                    fn(*args)
                    took[owners[0]] += time.perf_counter() - t
            if r >= 3:  # the first runs warm up
                for lap, t in zip(laps, took):
                    lap.append(t)
        return [median(lap) for lap in laps]

    def _clock_calls(self, xs, runs: int) -> list[float]:
        clock = time.perf_counter
        laps: list[list[float]] = [[] for _ in self._calls]
        for r in range(runs + 3):
            for x, view in zip(xs, self._in_views):
                view.copy_(x)
            t = clock()
            for lap, (fn, args) in zip(laps, self._calls):
                fn(*args)
                now = clock()
                if r >= 3:  # the first runs warm up
                    lap.append(now - t)
                t = now
        return [median(lap) for lap in laps]

    def _clock_torch(self, xs, runs: int) -> tuple[dict[str, float], float]:
        """The graph's tasks and glue run by PyTorch (each task's reference: the anchor op
        then its epilogue ops, eager) in order, each clocked; named as our steps are."""
        laps: dict[str, list[float]] = {}
        last = [0.0]

        def lap(name: str, keep: bool) -> None:
            now = time.perf_counter()
            if keep:
                laps.setdefault(name, []).append(now - last[0])
            last[0] = time.perf_counter()
        prev = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            for r in range(runs + 3):  # the first runs warm up
                last[0] = time.perf_counter()
                run_steps(self.part, xs, lambda name, keep=r >= 3: lap(name, keep))
        finally:
            torch.set_num_threads(prev)
        per = {k: median(v) for k, v in laps.items()}
        return per, sum(per.values())


    def first_divergence(self, inputs, atol: float = 1e-3) -> str:
        """Run the compiled steps one at a time next to the tasks' references and name the
        first value that disagrees (buffers are reused, so each is compared when written)."""
        env = run_steps(self.part, inputs)
        with torch.no_grad():
            for x, view in zip(inputs, self._in_views):
                view.copy_(x)
            for s, (fn, args) in zip(self.steps, self._calls):
                fn(*args)
                if id(s) not in self.value_of:
                    continue
                value, label = self.value_of[id(s)]
                want, buf = env[value], s.writes[0]
                flat = self._arrays[id(buf)][: buf.size]
                got = torch.from_numpy(flat.copy()).view(want.shape) if label == NCHW \
                    else Layout.parse(label).unpack(flat, tuple(want.shape))
                err = scaled_error(got, want)
                if not err <= atol:
                    return (f"first divergence at step {s.name} (value {value}, error "
                            f"{err:.3g} of the value's scale)")
        return f"no single step diverges beyond {atol}; the error accumulates"


def torch_seconds(compute, threads: int, opts: TimingOptions =
                  TimingOptions(warmup=2, min_repeat_ms=10, repeats=5),
                  cold_weights: bool = False) -> float:
    """PyTorch's median time for one task (its reference, eager, NCHW) on random operands;
    with `cold_weights`, its conv/dense weights rotate through copies as our kernels' do
    when timed, so the two are compared under the same protocol."""
    ops = random_operands(compute)
    sets = [ops]
    if cold_weights and compute.op in ("conv2d", "dense"):
        sets = [[ops[0], ops[1].clone(), *ops[2:]]
                for _ in range(cold_copies(ops[1].numel() * 4))]
    turn = [0]

    def run() -> None:
        turn[0] = (turn[0] + 1) % len(sets)
        reference(compute, *sets[turn[0]])
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            return median(time_fn(run, opts))
    finally:
        torch.set_num_threads(prev)


def island_seconds(part: Partition, inputs: Sequence[torch.Tensor], threads: int,
                   opts: TimingOptions = TimingOptions(warmup=2, min_repeat_ms=10, repeats=5)
                   ) -> float:
    """PyTorch's median time for the network's islands, each timed alone on the values it
    receives when the network runs `inputs` (as they run in the compiled network), summed;
    0.0 without islands."""
    nodes = part.graph.node_map()
    islands = [nodes[s.node] for s in part.steps
               if isinstance(s, GlueStep) and nodes[s.node].op == "torch"]
    if not islands:
        return 0.0
    env = run_steps(part, inputs)
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            return sum(median(time_fn(lambda n=n: run_glue(n, env), opts)) for n in islands)
    finally:
        torch.set_num_threads(prev)


# ------------------------------------------------------------------------ compile_network

def compile_network_cpu(model: torch.nn.Module,
                        example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                        records: Iterable[Record] = (),
                        target: "str | Target" = "llvm",
                        fallback: str | None = None, threads: int = 1, layout: str = "ilp",
                        time_limit_s: float = 20.0, check: bool = True,
                        atol: float | None = None,
                        verbose: bool = False, solver: Solver = solve_ilp,
                        refine: int = 8) -> CompiledNetwork:
    """compile_network() for an llvm target from `records`, those of its target and thread
    count measured on this CPU (compile.api.cpu_records picks them; compile.api dispatches
    here)."""
    tgt = parse_target(target)
    if tgt.kind != "llvm":
        raise CompileError(f"target {target!r}: no network compiler for this target kind")
    problem = unusable_mcpu(tgt.mcpu)
    if problem:
        raise CompileError(f"target {str(tgt)!r}: {problem}")
    if fallback not in (None, TORCH):
        raise CompileError(f"fallback must be None or 'torch', got {fallback!r}")
    if layout not in ("ilp", "uniform"):
        raise CompileError(f"layout must be 'ilp' or 'uniform', got {layout!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise CompileError(f"threads must be a positive integer, got {threads!r}")
    if not time_limit_s > 0 or not (atol is None or atol >= 0):
        raise CompileError(f"time_limit_s must be > 0 and atol >= 0, got {time_limit_s!r} "
                           f"and {atol!r}")
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) \
        else tuple(example_inputs)
    recs = list(records)
    # without records (nor PyTorch to fall back on) every kernel is untuned and checked in
    # a child (probe.py): started now, it imports while this process captures and plans
    checker = [start_child(CHECK_CHILD)] if not recs and not fallback else []
    try:
        graph = capture(model, inputs)
        part = partition(graph)
        cold = any(r.cold_weights for r in recs)  # transforms and torch timed as kernels
        opts = MeasureOptions(threads=threads, min_repeat_ms=5, repeats=5, cold_weights=cold)
        cpu, precision = cpu_info(tgt.mcpu), tgt.precision
        problem = precision_problem(cpu, precision)
        if problem:
            raise CompileError(f"target {str(tgt)!r}: {problem}")
        no_kernel = {t.key: why for t in part.tasks
                     if (why := no_kernel_reason(t.compute, cpu, precision))}
        recs = _in_todays_spaces(recs, part.tasks, cpu, no_kernel, precision)
        tseconds = {t.key: torch_seconds(t.compute, threads, cold_weights=cold)
                    for t in part.tasks if fallback or t.key in no_kernel}
        unchecked: list[int] = []
        cands = _candidates(part, recs, fallback, tseconds, threads, cpu, no_kernel,
                            family_of=layout_family, unchecked=unchecked,
                            precision=precision)
        # every edge's transform, timed at once (parallel builds, one isolated child) or
        # looked up in this machine's transform cache; untuned, priced by a model instead
        # (its node costs are estimates too): a first compile times no transform
        bordering = functools.partial(_writes_bordered, part)
        priced_at = None if recs else cpu.machine.ghz
        # the plan nhwc_reads weighs may read NHWC where a copy stood: its transforms too
        offered = (_with_twins(part, cands) if refine > 1 and recs else None) or cands
        if priced_at is None:
            measure_transforms(transforms_asked(lambda cost: step_problem(part, offered, cost,
                                                                          bordering)), opts)
        verdicts: dict = {}
        # from records, the ILP's plan is weighed as it runs against the one-layout plan
        weigh_layouts = layout == "ilp" and refine > 1 and bool(recs)
        one_layout = None
        while True:  # chosen untuned kernels pass an isolated check, or are chosen again
            plans = [choose(part, cands, way,
                            lambda shape, a, b: transform_cost(shape, a, b, opts, priced_at),
                            time_limit_s, solver, bordering)
                     for way in ((layout, "uniform") if weigh_layouts else (layout,))]
            (plan, chosen), one_layout = plans[0], (plans[1] if weigh_layouts else None)
            dropped = [_drop_failed_untuned(part, cands, c, unchecked, verdicts, tseconds,
                                            threads, tgt.mcpu, checker) for _, c in plans]
            if not any(dropped):
                break
    finally:  # a check child nothing was left for (or a compile that raised)
        for child in checker:
            child.kill()
            child.communicate()
    best = best_per_task(recs, str(tgt), threads)
    others = dict(tseconds)  # PyTorch's time, or the untuned estimate, where no record is
    for step, cs in zip(part.steps, cands):
        if isinstance(step, TaskStep) and step.key not in best and step.key not in others:
            others[step.key] = min(c.seconds for c in cs)
    estimated = estimated_latency(part, best, others)
    kernels: dict = {}  # (task key, config) -> loaded kernel, shared by the plan's variants

    def assemble(chosen: list[Candidate]) -> CompiledNetwork:
        planner = Planner(part, tgt.mcpu, opts, borders_wanted(part, chosen), priced_at)
        planner.kernels = kernels
        for step, cand in zip(part.steps, chosen):
            if isinstance(step, TaskStep):
                planner.task(step, cand)
            else:
                planner.glue(step)
        outputs = planner.outputs()
        built = CompiledNetwork(part, planner.steps, planner.inputs, outputs, threads, plan,
                                estimated, planner.value_of, planner.aliases)
        built.recorded = frozenset(best)
        return built
    weighed, nhwc, refined, agreed, net = None, None, None, None, None
    twins_timed: dict = {}
    if refine > 1 and recs:  # each may hand back the network of its plan, built and timed
        prebuild = functools.partial(_prebuild, part, kernels, tgt.mcpu)
        if one_layout is not None:
            chosen, weighed = _weigh_layouts(part, chosen, one_layout[1], assemble, prebuild,
                                             inputs, threads)
            if weighed.kept:  # the networks assembled from here on carry this plan
                plan = one_layout[0]
        twins = None  # the ILP's plan where convs may read NHWC in channel blocks
        # an untuned step keeps the kernel its check passed: the others were never checked
        twinned = _with_twins(part, cands, {i: chosen[i] for i in unchecked})
        if twinned is not None and not (weighed is not None and weighed.kept):
            twin_plan, twins, twins_timed = _timed_twins(
                part, cands, twinned, lambda cs: choose(
                    part, cs, layout, lambda shape, a, b: transform_cost(
                        shape, a, b, opts, priced_at), time_limit_s, solver, bordering),
                opts, tgt.mcpu)
        chosen, nhwc = _nhwc_reads(part, chosen, assemble, prebuild, inputs, threads, twins)
        if nhwc.kept and twins is not None:
            plan = twin_plan
        chosen, refined, net = _refine(part, chosen, recs, assemble, prebuild, inputs,
                                       threads, refine)
        chosen, agreed, net = _agree(part, chosen, recs, assemble, prebuild, inputs,
                                     threads, net)
    if net is None:
        net = assemble(chosen)
    net.examples, net.mcpu, net.refined, net.agreed = inputs, tgt.mcpu, refined, agreed
    net.weighed, net.nhwc_reads, net.twins_timed = weighed, nhwc, twins_timed
    if verbose:
        print(f"compiled {len(net.steps)} steps "
              f"({sum(s.kind == 'kernel' for s in net.steps)} kernels, "
              f"{sum(s.kind == 'transform' for s in net.steps)} transforms, "
              f"{sum(s.kind == 'torch' for s in net.steps)} torch); layout plan "
              f"{plan.cost * 1e3:.3f} ms by {plan.solver} in {plan.seconds:.2f} s")
        if weighed is not None:
            print(weighed.describe())
        if twins_timed:
            ratios = sorted(twins_timed.values())
            print(f"{len(ratios)} kernel(s) turned to read NHWC, timed against their "
                  f"originals before the plan took them (now or by an earlier compile): "
                  f"{ratios[len(ratios) // 2]:.2f}x their time (median; "
                  f"{ratios[0]:.2f}-{ratios[-1]:.2f})")
        if nhwc is not None:
            print(nhwc.describe())
        if refined is not None:
            print(refined.describe())
        if agreed is not None:
            print(agreed.describe())
    if check:
        net.checked_within = check_network(net, model, inputs, atol, precision)
    return net


def _prebuild(part: Partition, kernels: dict, mcpu: str | None, pairs) -> set:
    """Build the kernels of (task key, config) pairs at once (in parallel) into `kernels`,
    the Planner's table of loaded kernels; returns the pairs that failed to build."""
    from raytune_kernels.cpu.build import LoadedKernel
    from raytune_kernels.cpu.llvm.ir import render
    from raytune_kernels.cpu.parallel_build import build_all
    todo = [(key, cfg, lower(part.task(key).compute, cfg)) for key, cfg in pairs
            if (key, cfg) not in kernels]
    built = build_all([render(nest) for _, _, nest in todo], mcpu, persist=True)
    failed = set()
    for (key, cfg, nest), b in zip(todo, built):
        if b.error:
            failed.add((key, cfg))
        else:
            kernels[(key, cfg)] = (LoadedKernel(b.library, nest.name, len(nest.buffers)), nest)
    return failed


def _handed_over(x: torch.Tensor) -> bool:
    """Whether the native calls can read `x` where it lies: laid out as the network's own
    buffer of it (contiguous float32 on the CPU, 64-byte aligned)."""
    return x.dtype is torch.float32 and x.layout is torch.strided and x.is_cpu and \
        x.is_contiguous() and x.data_ptr() % ALIGN == 0


def _weigh_layouts(part: Partition, chosen: list[Candidate], other: list[Candidate],
                   assemble, prebuild, inputs, threads: int):
    """compile/refine.py's weighing of the ILP's plan against the one-layout plan, end to
    end as the network runs."""
    from raytune_kernels.compile import refine as rf

    xs = random_inputs([tuple(x.shape) for x in inputs], inputs)
    key = rf.decision_key(part, chosen, rf.differences(chosen, other), threads, kind="layouts")
    return rf.weigh_plans(part, chosen, other, assemble, xs, prebuild, key=key)


def _nhwc_reads(part: Partition, chosen: list[Candidate], assemble, prebuild, inputs,
                threads: int, twins: list[Candidate] | None = None):
    """compile/cpu_plan.nhwc_reads's plan, where it runs faster end to end than the plan
    with the copies (refine.weigh_plans). `twins`: the layout ILP's plan where convs
    could also read NHWC values in channel blocks (nhwc_twins), which nhwc_reads then
    completes, in place of `chosen`'s."""
    from raytune_kernels.compile import refine as rf

    fused = nhwc_reads(part, chosen if twins is None else twins)
    xs = random_inputs([tuple(x.shape) for x in inputs], inputs)
    key = rf.decision_key(part, chosen, rf.differences(chosen, fused), threads,
                          kind="nhwc_reads")
    return rf.weigh_plans(part, chosen, fused, assemble, xs, prebuild, key=key,
                          report=rf.NhwcReads())


def _refine(part: Partition, chosen: list[Candidate], recs: list[Record], assemble,
            prebuild, inputs, threads: int, most: int):
    """compile/refine.py's pass over the plan: the kernels each step runs fastest as the
    network runs, among the best `most` records of its layouts."""
    from raytune_kernels.compile import refine as rf

    alts = rf.alternatives(part, chosen, _read_as_chosen(part, chosen, recs), layouts_of,
                           threads, most, functools.partial(_writes_bordered, part),
                           prefetch_twin)
    xs = random_inputs([tuple(x.shape) for x in inputs], inputs)
    return rf.refine(part, chosen, alts, assemble, xs,
                     rf.variant_count(alts, most, _weight_bytes(part)), prebuild,
                     key=rf.decision_key(part, chosen, alts, threads))


def _agree(part: Partition, chosen: list[Candidate], recs: list[Record], assemble,
           prebuild, inputs, threads: int, net):
    """compile/refine.py's split agreement over the (refined) plan: steps splitting rows
    first between the threads, where the network runs faster so; first by records that
    do, then, on the plan that kept, by the plan's own kernels with their loops reordered
    (schedules.rows_first_twin), which no record needs to hold."""
    from raytune_kernels.compile import refine as rf

    if threads < 2:  # one thread splits nothing
        return chosen, None, net
    xs = random_inputs([tuple(x.shape) for x in inputs], inputs)
    bordered = functools.partial(_writes_bordered, part)
    networks = rf.MEMORY_BYTES // max(_weight_bytes(part), 1)
    rows = rf.row_alternatives(part, chosen, _read_as_chosen(part, chosen, recs), layouts_of,
                               threads, bordered)
    chosen, agreed, net = rf.agree(
        part, chosen, rows, assemble, xs, prebuild, net=net, networks=networks,
        key=rf.decision_key(part, chosen, rows, threads, kind="agree"))
    twins = rf.row_alternatives(
        part, chosen, (), layouts_of, threads, bordered,
        lambda step, cfg: rows_first_twin(part.task(step.key).compute, cfg, threads,
                                          rf.ROW_AXES))
    chosen, reordered, net = rf.agree(
        part, chosen, twins, assemble, xs, prebuild, net=net, networks=networks,
        key=rf.decision_key(part, chosen, twins, threads, kind="agree_reordered"))
    return chosen, agreed.joined(reordered), net


def _read_as_chosen(part: Partition, chosen: list[Candidate], recs: list[Record]
                    ) -> list[Record]:
    """`recs`, and for each step whose kernel reads NHWC in channel blocks (nhwc_twins,
    nhwc_reads) its task's records turned to read so too, timed as they were: refine and
    the split agreement weigh such a step among those as among any records of its
    layouts."""
    turned = {step.key for step, cand in zip(part.steps, chosen)
              if isinstance(step, TaskStep) and cand.config not in (None, TORCH)
              and cand.config.get("in_layout") == "nhwc"}
    extra = []
    for r in recs:
        if r.task_key in turned and r.ok:
            twin = nhwc_reader(part.task(r.task_key).compute, Config.from_json(r.config))
            if twin is not None:
                extra.append(dataclasses.replace(r, config=twin.to_json()))
    return list(recs) + extra if extra else recs


def _weight_bytes(part: Partition) -> int:
    """The graph's weights: about what each network built from its plan packs."""
    return sum(p.numel() * p.element_size() for p in part.graph.params.values()
               if isinstance(p, torch.Tensor))


def _writes_bordered(part: Partition, step: TaskStep, cand: Candidate) -> bool:
    """Whether the candidate's kernel can write its output into a bordered buffer."""
    return cand.config not in (None, TORCH) and \
        writes_bordered(part.task(step.key).compute, cand.config)


def _in_todays_spaces(recs: list[Record], tasks, cpu: CpuInfo, no_kernel: dict[str, str],
                      precision: str = DEFAULT) -> list[Record]:
    """The valid records whose config is a point of its task's schedule space today. A
    record of an older space (a knob since added or renamed) is skipped with one warning,
    not left to fail with a KeyError deep in the layout costs; one that lacks only a knob
    added since with the old kernel as its default (space.KNOB_DEFAULTS) is kept. Tasks
    whose every record is such an older one were never searched over what that knob adds
    (NHWC depthwise convs and pools, say): one warning names them, since the plan cannot
    pick what they were never tuned for."""
    spaces = {t.key: space_for(t.compute, cpu, precision) for t in tasks
              if t.key not in no_kernel}
    kept, stale, configs = [], [], []
    for r in recs:
        space = spaces.get(r.task_key)
        cfg = Config.from_json(r.config) if r.ok and space is not None else None
        if cfg is not None and cfg not in space and completed(cfg, space) not in space:
            stale.append(r)
            continue
        kept.append(r)
        if cfg is not None:
            configs.append((r.task_key, cfg))
    if stale:
        warnings.warn(f"skipped {len(stale)} record(s) whose config is not in today's "
                      f"schedule space (an older version wrote them), first: task "
                      f"{stale[0].task_key} config {stale[0].config}", stacklevel=3)
    older = describe_tuned_before(tasks, tuned_before_knobs(configs, spaces))
    if older:
        warnings.warn(f"{older}: tune them again (more trials into these records, or a new "
                      f"records file)", stacklevel=3)
    return kept


def _candidates(part: Partition, recs: list[Record], fallback: str | None,
                tseconds: dict[str, float], threads: int, cpu: CpuInfo,
                no_kernel: dict[str, str], family_of: Callable | None = None,
                unchecked: list[int] | None = None, precision: str = DEFAULT
                ) -> list[list[Candidate]]:
    """Per step (in order): what may run it. The fastest few are kept (within SLACK of the
    best); with `family_of`, the fastest few of every layout family reading and writing
    that family are kept as well: a kernel that needs no transform around it can beat a
    faster one that does, and the uniform baseline chooses among exactly those.

    A task without a usable record runs PyTorch's kernel with fallback="torch", else the
    analytic estimate's best configs (untuned); a task no kernel of ours can run runs
    PyTorch's kernel either way. Each of the two is named in one warning. The positions
    of untuned steps go to `unchecked` (their kernels are checked once chosen)."""
    out, untuned, islands = [], {}, {}
    unchecked = [] if unchecked is None else unchecked
    for step in part.steps:
        if isinstance(step, GlueStep):
            out.append([Candidate(NCHW, NCHW, 0.0)])
            continue
        task = part.task(step.key)
        if step.key in no_kernel:
            islands[step.key] = f"{task.compute.describe()} ({no_kernel[step.key]})"
            out.append([Candidate(NCHW, NCHW, tseconds[step.key], TORCH)])
            continue
        tuned = [c for c in candidates_from_records(task, recs, layouts_of, threads)
                 if _bindable(part, step, c)]
        if tuned:
            tuned = prune(tuned, family_of)
        if fallback:
            tuned = [c for c in tuned if c.seconds <= tseconds[step.key]]
            tuned.append(Candidate(NCHW, NCHW, tseconds[step.key], TORCH))
        elif not tuned:
            tuned = estimated_candidates(part, step, cpu, threads, precision)
            if tuned:
                untuned[step.key] = task.compute.describe()
                tuned = prune(tuned, family_of)
            else:  # no config of the space can be fed its operands here
                islands[step.key] = f"{task.compute.describe()} (no config binds its operands)"
                tseconds[step.key] = torch_seconds(task.compute, threads)
                tuned = [Candidate(NCHW, NCHW, tseconds[step.key], TORCH)]
            if step.key in untuned:
                unchecked.append(len(out))
        out.append(tuned)
    if islands:
        warnings.warn(f"{len(islands)} task(s) run PyTorch's kernel, no kernel of ours fits "
                      "them: " + "; ".join(list(islands.values())[:6])
                      + ("; ..." if len(islands) > 6 else ""), stacklevel=3)
    if untuned:
        warnings.warn(f"{len(untuned)} task(s) have no record at {threads} thread(s) and run "
                      "the analytic estimate's best config, untuned (tune them for speed): "
                      + "; ".join(list(untuned.values())[:6])
                      + ("; ..." if len(untuned) > 6 else ""), stacklevel=3)
    return out


def _with_twins(part: Partition, cands: list[list[Candidate]],
                fixed: dict[int, Candidate] | None = None) -> list[list[Candidate]] | None:
    """`cands` with each step's nhwc_twins added, the steps of `fixed` held to their one
    candidate; None where no step has a twin."""
    out, added, fixed = [], False, fixed or {}
    for i, (step, cs) in enumerate(zip(part.steps, cands)):
        if i in fixed:
            out.append([fixed[i]])
            continue
        twins = [] if not isinstance(step, TaskStep) else [
            c for c in nhwc_twins(part.task(step.key), [c for c in cs if c.config not in
                                                         (None, TORCH)])
            if _bindable(part, step, c)]
        out.append(cs + twins)
        added = added or bool(twins)
    return out if added else None


TWIN_PLANS = 6  # layout plans solved at most while the turned kernels they chose are timed


def _timed_twins(part: Partition, cands: list[list[Candidate]],
                 twinned: list[list[Candidate]], plan_of: Callable, opts: MeasureOptions,
                 mcpu: str | None, timer: Callable | None = None
                 ) -> tuple[LayoutPlan, list[Candidate], dict]:
    """The layout plan over `twinned` (`cands` with nhwc_twins; plan_of(candidates) ->
    (plan, chosen)) with no twin in it priced by its original's record alone: a twin
    reads a few channels of each NHWC pixel where its original read a contiguous block,
    at a cost that depends on the block and the image and is only known timed. Each twin
    the plan chose is timed beside its original, in a child (probe.time_isolated, or
    `timer`; the ratio is remembered per machine in compile/refine.py's cache), and
    priced as that record times the twin's ratio to it (inf where either fails), and the
    plan solved again, until it chooses no twin untimed; the last of TWIN_PLANS plans is
    solved without the twins still untimed. Returns the plan, its choice, and (task key,
    twin config) -> the twin's ratio to its original, of every twin a plan chose."""
    from raytune_kernels.compile import refine as rf
    from raytune_kernels.cpu.probe import TIME_CHILD, time_isolated

    def twin(c: Candidate, cs: list[Candidate]) -> bool:
        return not any(c is o for o in cs)

    def offer(step: TaskStep, cs: list[Candidate], c: Candidate, last: bool
              ) -> Candidate | None:
        """`c` as a plan is offered it: a twin at its timed price; none where it failed,
        nor untimed in the last plan."""
        if not twin(c, cs):
            return c
        timed = priced.get((step.key, c.config))
        if timed is None:
            return None if last else c
        return dataclasses.replace(c, seconds=timed[0]) if timed[0] < math.inf else None
    own = timer is None  # a timing child of ours, started ahead of each round's plan
    timer = timer or functools.partial(time_isolated, mcpu=mcpu)
    priced: dict[tuple[str, Config], tuple[float, float]] = {}  # -> (seconds, ratio)
    child = None
    try:
        for round_ in range(TWIN_PLANS):
            last = round_ == TWIN_PLANS - 1
            offered = [ts if not isinstance(step, TaskStep) else
                       [o for c in ts if (o := offer(step, cs, c, last)) is not None]
                       for step, cs, ts in zip(part.steps, cands, twinned)]
            plan, chosen = plan_of(offered)
            todo: dict[tuple[str, Config], Candidate] = {}
            for step, cs, c in zip(part.steps, cands, chosen):
                if isinstance(step, TaskStep) and twin(c, cs) and \
                        (step.key, c.config) not in priced:
                    compute = part.task(step.key).compute
                    todo[step.key, c.config] = next(
                        o for o in cs if o.config not in (None, TORCH)
                        and nhwc_reader(compute, o.config) == c.config)
            if not todo:
                break
            recalled = {key: rf.recall(_twin_key(key, opts), {}) for key in todo}
            fresh = [(key, original) for key, original in todo.items() if not recalled[key]]
            items = [(part.task(key).compute, cfg) for (key, turned), original in fresh
                     for cfg in (original.config, turned)]
            seconds = []
            if items:
                seconds, child = timer(items, opts, child=child), None
            for k, (key, original) in enumerate(fresh):
                alone, turned = seconds[2 * k], seconds[2 * k + 1]
                ratio = turned / alone if math.isfinite(alone) else math.inf
                rf.remember(_twin_key(key, opts), [], 0, ratio)
                recalled[key] = {"speedup": ratio}
            for key, original in todo.items():
                ratio = recalled[key]["speedup"]
                priced[key] = (original.seconds * ratio, ratio)
            if own and child is None and round_ < TWIN_PLANS - 2:  # imports as a plan solves
                child = start_child(TIME_CHILD)
    finally:
        if child is not None:
            child.kill()
            child.communicate()
    return plan, chosen, {key: ratio for key, (_, ratio) in priced.items()}


def _twin_key(key: tuple[str, Config], opts: MeasureOptions) -> str:
    """Where a twin's ratio to its original is remembered (compile/refine.py's cache): by
    the machine and code, the task, the twin's config, the threads and the weights' heat."""
    from raytune_kernels.compile import refine as rf

    text = json.dumps(["nhwc_twin", rf.fingerprint(), opts.threads, opts.cold_weights,
                       key[0], key[1].to_json()], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def nhwc_twins(task: Task, cands: list[Candidate]) -> list[Candidate]:
    """Each candidate reading its input in channel blocks, turned to read it NHWC as it
    lies (schedules.nhwc_reader: the same loops and sums, a block at a time), priced as
    its record timed the original; where no candidate that reads NHWC and writes the
    same layout is as fast. A conv's records hold few configs that read NHWC (those
    whose block spans every channel), and the layout plan otherwise weighs the copy into
    blocks against the best of those alone."""
    out: list[Candidate] = []
    for cand in sorted(cands, key=lambda c: c.seconds):
        twin = nhwc_reader(task.compute, cand.config)
        if twin is None:
            continue
        into, written = layouts_of(task, twin)
        if any(c.in_layout == into and c.out_layout == written and c.seconds <= cand.seconds
               for c in cands + out):
            continue
        out.append(Candidate(into, written, cand.seconds, twin))
    return out


def _drop_failed_untuned(part: Partition, cands: list[list[Candidate]], chosen: list,
                         unchecked: list[int], verdicts: dict, tseconds: dict, threads: int,
                         mcpu: str | None, checker: list | None = None) -> bool:
    """Untuned kernels were never run by a measurer: the chosen ones are checked against
    their references in a child process (cpu/probe.check_isolated) before this process
    runs any. Failed ones leave the candidates (a step left with none runs PyTorch's
    kernel, named in a warning); True when any did, so that the layouts are chosen again.
    `verdicts` keeps what was checked across rounds; `checker` may hold a check child
    started ahead (probe.start_child), which the first check takes."""
    todo = [(part.task(part.steps[i].key).compute, chosen[i].config) for i in unchecked
            if chosen[i].config not in (None, TORCH)]
    todo = [item for item in dict.fromkeys(todo) if item not in verdicts]
    if not todo:
        return False
    from raytune_kernels.cpu.probe import check_isolated

    child = checker.pop() if checker else None
    verdicts.update(zip(todo, check_isolated(todo, mcpu, threads, child=child)))
    dropped, torch_now = False, []
    for i in unchecked:
        compute = part.task(part.steps[i].key).compute
        kept = [c for c in cands[i] if verdicts.get((compute, c.config)) is None]
        if len(kept) == len(cands[i]):
            continue
        dropped = True
        if not kept:
            error = next(verdicts[(compute, c.config)] for c in cands[i]
                         if (compute, c.config) in verdicts)
            key = part.steps[i].key
            tseconds[key] = torch_seconds(compute, threads)
            kept = [Candidate(NCHW, NCHW, tseconds[key], TORCH)]
            torch_now.append(f"{compute.describe()} ({error})")
        cands[i] = kept
    if torch_now:
        warnings.warn(f"{len(torch_now)} step(s) run PyTorch's kernel: their untuned kernels "
                      f"failed their isolated check: " + "; ".join(dict.fromkeys(torch_now)),
                      stacklevel=3)
    return dropped


UNTUNED_POOL = 48  # random configs an untuned task's estimate chooses among


def estimated_candidates(part: Partition, step: TaskStep, cpu: CpuInfo,
                         threads: int = 1, precision: str = DEFAULT) -> list[Candidate]:
    """An untuned task's candidates: the fewest estimated cycles (cpu/estimate.py) at
    `threads` threads per layout pair among a fixed random pool of configs, priced at the
    machine's clock."""
    best: dict[tuple[str, str], Candidate] = {}
    for cand in _estimated_pool(part.task(step.key), cpu, threads, precision):
        pair = (cand.in_layout, cand.out_layout)
        if (pair not in best or cand.seconds < best[pair].seconds) and \
                _bindable(part, step, cand):
            best[pair] = cand
    return [best[p] for p in sorted(best)]  # empty: no config binds its operands


@functools.lru_cache(maxsize=1024)  # a task recurs in many steps (BERT: 12 layers)
def _estimated_pool(task, cpu: CpuInfo, threads: int = 1, precision: str = DEFAULT
                    ) -> tuple[Candidate, ...]:
    """The task's fixed random pool of configs that lower, each priced by the estimate."""
    space, rng = space_for(task.compute, cpu, precision), random.Random(task.key)
    out = []
    for cfg in dict.fromkeys(space.sample(rng) for _ in range(UNTUNED_POOL)):
        try:
            nest = lower(task.compute, cfg)
            seconds = cycles(nest, cpu.machine, threads) / (cpu.machine.ghz * 1e9)
        except ValueError:  # a config this compute cannot lower: not a candidate
            continue
        out.append(Candidate(*layouts_of(task, cfg), seconds, cfg))
    return tuple(out)


def _bindable(part: Partition, step: TaskStep, cand: Candidate) -> bool:
    """Whether the planner can feed this kernel its data operands: a per-channel or
    residual operand that is an activation must be laid out as the kernel reads it."""
    c = part.task(step.key).compute
    if c.op in ROW_OPS:
        return True
    con = contraction(c)
    for arg, kind in zip(step.args[len(c.inputs):], operand_kinds(c)):
        if arg in part.graph.params:
            continue
        if kind.kind == "channel" and \
                math.prod(part.graph.shape_of(arg)) != con.channel_len(cand.config):
            return False
        if kind.kind == "output" and con.buffer_sizes(cand.config)["out"] != c.output.numel:
            return False
    return True


def check_network(net: CompiledNetwork, model, inputs, atol: float | None = None,
                  precision: str = DEFAULT) -> float:
    """net(x) against model(x), within `atol` of the output's scale or, without one, the
    bound of `precision` for this model (report.held_to); on a mismatch, name the first
    step that diverges. Returns the bound."""
    with torch.no_grad():
        want = model(*inputs)
        got = net(*inputs)
    err = output_error(got, want)
    atol, why = held_to(err, model, inputs, precision, atol)
    if err <= atol:
        return atol
    limit = f"{atol:.3g}: {why}" if why else f"{atol}"
    raise CompileError(f"compiled network differs from the model: error {err:.3g} of the "
                       f"output's scale (limit {limit}); "
                       f"{net.first_divergence(inputs, atol)}")
