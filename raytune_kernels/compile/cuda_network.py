"""compile_network() on a "cuda" target: a tuned network as a flat list of GPU launches.

Two halves, kept apart so the first is tested without a GPU:

- The PLAN (plan_network, pure Python and bytes): the best cuda record of every task for
  one arch, each kernel rendered and built by NVRTC once, weights packed once into the
  flat arrays the kernels read (numpy), the torch steps (glue, fallback, layout
  transforms), every activation's offset in one preallocated arena, launch geometry and
  the order of the steps.
- The EXECUTION (a Device: a few methods that give the plan's buffers memory and run its
  launches). CupyDevice runs on a GPU: the arena and constants are torch CUDA tensors,
  cupy launches the cubins on views of the same memory (__cuda_array_interface__, no copy),
  and both libraries use the legacy default stream, so launches and torch steps run in
  plan order without explicit synchronisation. The tests run the same plan through a CPU
  emulator device (tests/gpu_emulator.py, cuda_emulate underneath).

Layouts: convolutions and windows are tuned in NCHW and in NHWC (the config's `layout`).
The layout ILP of the CPU path (layout/graph + layout/problem.solve_ilp) chooses each step's
kernel among the best record of each layout, and torch's kernel where fallback="torch"
and it is faster, against the cost of the transforms the choice implies; those costs are
timed on the GPU by the device (a torch permute + contiguous copy, `to_layout`, under the
records' protocol). Values whose two layouts hold the same memory order (one channel, or
one pixel) are relabelled, not copied.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np
import torch

from raytune_kernels.cuda.build import compile_cuda, resource_problems
from raytune_kernels.cuda.kernel import CudaKernel
from raytune_kernels.cuda.render import (cuda_layouts, cuda_unsupported_reason, operand_layouts,
                                         render_cuda, to_buffer_layout)
from raytune_kernels.space import Config
from raytune_kernels.frontend.capture import capture
from raytune_kernels.layout.problem import LayoutPlan, solve_ilp
from raytune_kernels.layout.costs import candidates_from_records
from raytune_kernels.layout.graph import Candidate
from raytune_kernels.compile.choose import TORCH, Solver, choose, estimated_latency
from raytune_kernels.compile.report import Profile, ProfileRow, Reporting
from raytune_kernels.errors import CompileError
from raytune_kernels.frontend.partition import (GlueStep, Partition, TaskStep, partition, run_glue,
                                                run_steps)
from raytune_kernels.tune.records import Record, best_per_task, load_records
from raytune_kernels.measure import MeasureOptions, random_operands
from raytune_kernels.frontend.reference import reference
from raytune_kernels.target import Target, parse_target
from raytune_kernels.tune.timing import TimingOptions, median, time_runs
from raytune_kernels.cuda import device
from raytune_kernels.cuda.device import torch_gpu_mode
from raytune_kernels.cuda.torch_timing import time_torch_gpu

NCHW, NHWC = "NCHW", "NHWC"
ALIGN = 64  # floats: arena offsets on 256 bytes, as cudaMalloc aligns (float4 loads)
GPU_TIMING = MeasureOptions().timing()  # transforms and torch's kernels, timed as records


# ----------------------------------------------------------------------------- the plan

@dataclass(eq=False)
class GBuf:
    """A planned device buffer: `size` floats at `offset` in the arena, holding a value of
    logical `shape` stored in `layout`; or a view of another buffer (a reshape)."""

    size: int
    shape: tuple[int, ...]
    layout: str = NCHW
    pinned: bool = False  # graph inputs and outputs keep their memory for the whole run
    alias: "GBuf | None" = None
    offset: int = -1

    @property
    def root(self) -> "GBuf":
        return self.alias.root if self.alias is not None else self


@dataclass(frozen=True)
class Const:
    """A packed constant (weights, bias): index into GpuPlan.consts."""

    index: int


@dataclass(eq=False)
class GpuStep:
    """One step: a kernel launch (kernel + binary) or a torch function (glue, fallback,
    transform) of its operands, in operand order, writing `out`."""

    name: str
    kind: str  # "kernel", "torch", "glue", "transform"
    layers: tuple[str, ...]
    operands: list  # GBuf or Const, in the kernel's buffer order (out not included)
    out: GBuf
    estimate: float = 0.0
    key: str | None = None
    kernel: CudaKernel | None = None
    binary: bytes | None = None  # the cubin NVRTC built for the plan's arch
    fn: Callable | None = None

    @property
    def reads(self) -> list[GBuf]:
        return [o for o in self.operands if isinstance(o, GBuf)]


@dataclass
class GpuPlan:
    """Everything a device needs to run the network, decided without one."""

    arch: str
    part: Partition
    steps: list[GpuStep]
    inputs: list[GBuf]
    outputs: list[GBuf]
    consts: list[np.ndarray]
    arena_floats: int
    value_of: dict[int, tuple[str, str]]  # id(step) -> (graph value, layout) it completes
    estimated_s: float = 0.0
    layout_plan: LayoutPlan | None = None

    def summary(self) -> str:
        kinds = [s.kind for s in self.steps]
        lay = [s.out.layout for s in self.steps if s.kind == "kernel"]
        text = (f"{len(self.steps)} steps on {self.arch} ("
                + ", ".join(f"{kinds.count(k)} {k}" for k in sorted(set(kinds)))
                + f"; kernels writing {lay.count(NCHW)} NCHW, {lay.count(NHWC)} NHWC); "
                f"arena {self.arena_floats * 4 / 2**20:.2f} MiB, constants "
                f"{sum(c.nbytes for c in self.consts) / 2**20:.2f} MiB")
        if self.layout_plan is not None:
            p = self.layout_plan
            text += f"; layout plan {p.cost * 1e3:.3f} ms by {p.solver} in {p.seconds:.2f} s"
        return text


def physical_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """The row-major shape a buffer in `layout` holds (NHWC: N, H, W, C)."""
    if layout == NCHW:
        return tuple(shape)
    if layout == NHWC and len(shape) == 4:
        n, c, h, w = shape
        return (n, h, w, c)
    raise CompileError(f"layout {layout!r} of a {len(shape)}-D value: the GPU path stores "
                       "NCHW (contiguous) or 4-D NHWC values only")


def to_layout(x: torch.Tensor, src: str, dst: str) -> torch.Tensor:
    """A value held in `src` (its physical shape) as a contiguous tensor in `dst`; a torch
    permute + copy on whatever device x lives (first version: not a tuned kernel)."""
    if src == dst:
        return x
    if (src, dst) == (NCHW, NHWC) and x.dim() == 4:
        return x.permute(0, 2, 3, 1).contiguous()
    if (src, dst) == (NHWC, NCHW) and x.dim() == 4:
        return x.permute(0, 3, 1, 2).contiguous()
    raise CompileError(f"no transform of a {x.dim()}-D value from {src} to {dst} on the "
                       "GPU path")


def same_order(shape: tuple[int, ...], a: str, b: str) -> bool:
    """Whether layouts a and b hold a value's elements in the same memory order (equal,
    or a 4-D value with one channel or one pixel): then changing layout copies nothing."""
    return a == b or (len(shape) == 4 and (shape[1] == 1 or shape[2] * shape[3] == 1))


class _Planner:
    def __init__(self, part: Partition, arch: str):
        self.part, self.graph, self.arch = part, part.graph, arch
        self.steps: list[GpuStep] = []
        self.consts: list[np.ndarray] = []
        self.const_of: dict[tuple[str, str], Const] = {}
        self.produced: dict[str, tuple[GBuf, str]] = {}
        self.copies: dict[tuple[str, str], GBuf] = {}
        self.built: dict[tuple[str, Config], tuple[CudaKernel, bytes]] = {}
        self.value_of: dict[int, tuple[str, str]] = {}
        self.aliases: list[GBuf] = []
        self.inputs = [GBuf(math.prod(s), tuple(s), pinned=True) for _, s in self.graph.inputs]
        for (name, _), buf in zip(self.graph.inputs, self.inputs):
            self.produced[name] = (buf, NCHW)

    def const(self, name: str, layout: str = NCHW) -> Const:
        """A parameter packed once per layout (a GEMM conv's NHWC weight is KRSC)."""
        if (name, layout) not in self.const_of:
            p = self.graph.params[name].detach().cpu().float()
            packed = p if layout == NCHW else to_buffer_layout(p, layout, tuple(p.shape))
            self.consts.append(np.ascontiguousarray(packed.numpy()))
            self.const_of[(name, layout)] = Const(len(self.consts) - 1)
        return self.const_of[(name, layout)]

    def value(self, name: str, layout: str) -> GBuf:
        """`name` stored in `layout`, through a (cached) torch transform when needed."""
        buf, have = self.produced[name]
        if have == layout:
            return buf
        if (name, layout) in self.copies:
            return self.copies[(name, layout)]
        if same_order(buf.shape, have, layout):  # the same bytes under another label
            self.aliases.append(GBuf(buf.size, buf.shape, layout, alias=buf))
            self.copies[(name, layout)] = self.aliases[-1]
        else:
            physical_shape(buf.shape, layout)  # fails early for a layout we cannot store
            out = GBuf(buf.size, buf.shape, layout)
            fn = lambda x, a=have, b=layout: to_layout(x, a, b)  # noqa: E731
            self.steps.append(GpuStep(f"{name}: {have} -> {layout}", "transform", (),
                                      [buf], out, fn=fn))
            self.copies[(name, layout)] = out
        return self.copies[(name, layout)]

    def operand(self, name: str, layout: str = NCHW) -> "GBuf | Const":
        return self.const(name, layout) if name in self.graph.params else \
            self.value(name, layout)

    def task(self, step: TaskStep, cand: Candidate) -> None:
        """Plan a task step as its chosen candidate: a config (a kernel) or TORCH."""
        compute = self.part.task(step.key).compute
        if cand.config == TORCH:  # fallback="torch": torch's kernel on the device tensors
            ops = [self.operand(a) for a in step.args]
            out = GBuf(compute.output.numel, compute.output.shape)
            fn = lambda *xs, c=compute: reference(c, *xs)  # noqa: E731
            self._add(GpuStep(step.layer, TORCH, (step.layer,), ops, out, cand.seconds,
                              key=step.key, fn=fn), step.output)
            return
        cfg = cand.config
        kernel, binary = self._build(step, compute, cfg)
        out_layout = cuda_layouts(compute, cfg)[1]
        if len(step.args) != len(kernel.buffers) - 1:
            raise CompileError(f"{step.layer}: {len(step.args)} operands for the "
                               f"{len(kernel.buffers) - 1} input buffers of task "
                               f"{step.key}'s kernel")
        ops = []
        for arg, kb, lay in zip(step.args, kernel.buffers, operand_layouts(compute, cfg)):
            op = self.operand(arg, lay)
            size = self.consts[op.index].size if isinstance(op, Const) else op.size
            if size != kb.size:
                raise CompileError(f"{step.layer}: operand {arg} holds {size} floats, kernel "
                                   f"buffer {kb.name} of task {step.key} reads {kb.size}")
            ops.append(op)
        out = GBuf(compute.output.numel, compute.output.shape, out_layout)
        self._add(GpuStep(step.layer, "kernel", (step.layer,), ops, out, cand.seconds,
                          step.key, kernel, binary), step.output)

    def _build(self, step: TaskStep, compute, cfg: Config) -> tuple[CudaKernel, bytes]:
        """Render and NVRTC-build a (task, config) once; a config that no longer renders
        or builds is an error naming the layer (records outlive code changes)."""
        if (step.key, cfg) in self.built:
            return self.built[(step.key, cfg)]
        where = f"layer {step.layer} (task {step.key}, {compute.describe()})"
        try:
            kernel = render_cuda(compute, cfg)
        except Exception as exc:
            raise CompileError(f"{where}: its best cuda config no longer renders: "
                               f"{exc}") from None
        built = compile_cuda(kernel.source, self.arch, f"{kernel.name}.cu")
        problems = [built.error] if built.error else resource_problems(built, kernel.threads)
        if problems:
            raise CompileError(f"{where}: its best cuda config does not build for "
                               f"{self.arch}: " + "; ".join(problems))
        self.built[(step.key, cfg)] = (kernel, built.cubin)
        return self.built[(step.key, cfg)]

    def glue(self, step: GlueStep) -> None:
        node = self.graph.node_map()[step.node]
        shape = tuple(self.graph.shape_of(node.name))
        ops = [self.operand(v) for v in node.inputs]
        if node.op == "reshape" and isinstance(ops[0], GBuf):  # a view: no copy, no step
            self.aliases.append(GBuf(math.prod(shape), shape, alias=ops[0]))
            self.produced[node.name] = (self.aliases[-1], NCHW)
            return
        fn = lambda *xs, n=node: run_glue(n, dict(zip(n.inputs, xs)))  # noqa: E731
        self._add(GpuStep(node.name, "glue", (node.layer,), ops,
                          GBuf(math.prod(shape), shape), fn=fn), node.name)

    def _add(self, step: GpuStep, value: str) -> None:
        self.steps.append(step)
        self.produced[value] = (step.out, step.out.layout)
        self.value_of[id(step)] = (value, step.out.layout)

    def outputs(self) -> list[GBuf]:
        outs = [self.value(v, NCHW) for v in self.graph.outputs]
        for b in outs:
            b.root.pinned = True
        return outs


def assign_offsets(steps: list[GpuStep], pinned: Iterable[GBuf],
                   aliases: Iterable[GBuf] = ()) -> int:
    """Give every buffer an arena offset (ALIGN-rounded); a buffer's range is free again
    after its last reader, first fit. Returns the arena's size in floats."""
    pinned = list(pinned)
    last: dict[int, int] = {}
    for i, s in enumerate(steps):
        for b in s.reads + [s.out]:
            last[id(b.root)] = i
    live: list[tuple[int, int, GBuf]] = []  # (offset, rounded size, buffer)
    top = 0

    def place(b: GBuf) -> None:
        nonlocal top
        need = -(-b.size // ALIGN) * ALIGN
        start = 0
        for off, size, _ in sorted(live, key=lambda e: e[0]):
            if off - start >= need:
                break
            start = max(start, off + size)
        b.offset = start
        live.append((start, need, b))
        top = max(top, start + need)
    for b in {id(p.root): p.root for p in pinned}.values():
        place(b)
    keep = {id(p.root) for p in pinned}
    for i, s in enumerate(steps):
        if s.out.offset < 0 and s.out.alias is None:
            place(s.out)
        done = {id(b.root) for b in s.reads + [s.out]
                if last[id(b.root)] == i and id(b.root) not in keep}
        live = [e for e in live if id(e[2]) not in done]
    for b in list(aliases) + pinned:
        b.offset = b.root.offset
    return top


def plan_network(part: Partition, chosen: Sequence[Candidate | None], arch: str,
                 estimated_s: float = 0.0, layout_plan: LayoutPlan | None = None) -> GpuPlan:
    """The plan of a partitioned graph from each step's chosen candidate (a config, or
    TORCH; None for glue steps); builds every kernel with NVRTC for `arch`."""
    planner = _Planner(part, arch)
    for step, cand in zip(part.steps, chosen):
        if isinstance(step, TaskStep):
            planner.task(step, cand)
        else:
            planner.glue(step)
    outputs = planner.outputs()
    arena = assign_offsets(planner.steps, planner.inputs + outputs, planner.aliases)
    return GpuPlan(arch, part, planner.steps, planner.inputs, outputs, planner.consts,
                   arena, planner.value_of, estimated_s, layout_plan)


def step_candidates(part: Partition, records: list[Record],
                    torch_s: dict[str, float] | None = None) -> list[list[Candidate]]:
    """Per step: the best record of each (input, output) layout pair of its task, as
    Candidates carrying their Config; with `torch_s` (fallback="torch"), torch's kernel
    too at its measured time, and no record slower than it. Glue steps read and write
    NCHW."""
    def layouts(task, cfg):  # a stale config is named when planned, if it is chosen
        return cuda_layouts(task.compute, cfg)
    tuned = {t.key: candidates_from_records(t, records, layouts=layouts) for t in part.tasks}
    out = []
    for step in part.steps:
        if isinstance(step, GlueStep):
            out.append([Candidate(NCHW, NCHW, 0.0)])
            continue
        cands = list(tuned[step.key])
        if torch_s is not None:
            cands = [c for c in cands if c.seconds <= torch_s[step.key]]
            cands.append(Candidate(NCHW, NCHW, torch_s[step.key], TORCH))
        out.append(cands)
    return out


def choose_layouts(part: Partition, cands: list[list[Candidate]], layout: str,
                   transform_s: Callable[[tuple, str, str], float], time_limit_s: float,
                   solver: Solver = solve_ilp) -> tuple[LayoutPlan, list[Candidate | None]]:
    """Each step's candidate: the layout ILP over all of them ("ilp"), or the best plan
    that keeps one layout wherever a step has it ("uniform"). Transforms between layouts
    of the same memory order cost nothing."""
    def transform(shape, a, b):
        return 0.0 if same_order(tuple(shape), a, b) else transform_s(tuple(shape), a, b)
    plan, chosen = choose(part, cands, layout, transform, time_limit_s, solver)
    return plan, [c if isinstance(s, TaskStep) else None for s, c in zip(part.steps, chosen)]


# ------------------------------------------------------------------------ the execution

class Device(Protocol):
    """Memory and launches for a plan: the GPU (CupyDevice), or an emulator in tests. The
    class also times, before any plan exists, what the layout choice weighs."""

    def __init__(self, plan: GpuPlan) -> None:
        ...

    @staticmethod
    def transform_seconds(shape: tuple[int, ...], src: str, dst: str) -> float:
        """Seconds to turn a value of logical `shape` from layout src into dst."""

    @staticmethod
    def torch_seconds(compute) -> float:
        """Seconds of torch's kernel for a task on this device (fallback="torch")."""

    def tensor(self, buf: GBuf) -> torch.Tensor:
        """The buffer's `size` floats as a flat torch tensor sharing its memory."""

    def constant(self, const: Const) -> torch.Tensor:
        """The packed constant, shaped as the parameter it came from, on the device."""

    def kernel_call(self, step: GpuStep) -> Callable[[], None]:
        """A call that enqueues the step's launch (its arguments bound once)."""

    def timer(self, run: Callable[[], None]) -> Callable[[int], float]:
        """run(number) -> seconds for `number` calls of run, by the device's clock."""


class CupyDevice:
    """The plan on the current CUDA device (torch's and cupy's must be the same one; GPU 0
    unless set): one torch allocation for the arena, one per constant, each cubin loaded
    once (cupy RawModule), each launch's arguments made once as cupy views."""

    def __init__(self, plan: GpuPlan):

        cp = device.cupy()
        self.dev = torch.device("cuda", torch.cuda.current_device())
        if cp.cuda.Device().id != self.dev.index:
            raise CompileError(f"torch's current CUDA device is {self.dev.index}, cupy's "
                               f"{cp.cuda.Device().id}: set both to the same GPU")
        self.arena = torch.zeros(max(plan.arena_floats, 1), device=self.dev)
        self._arena_cp = cp.asarray(self.arena)  # the same memory
        self.consts = [torch.from_numpy(c).to(self.dev) for c in plan.consts]
        self._consts_cp = [cp.asarray(c.reshape(-1)) for c in self.consts]
        self._loaded: dict[bytes, object] = {}
        self._load = device.LoadedCudaKernel

    @staticmethod
    def transform_seconds(shape: tuple[int, ...], src: str, dst: str) -> float:
        x = torch.randn(physical_shape(shape, src), device="cuda")
        return median(time_torch_gpu(lambda: to_layout(x, src, dst), GPU_TIMING, True))

    @staticmethod
    def torch_seconds(compute) -> float:
        ops = [x.cuda() for x in random_operands(compute)]
        return median(time_torch_gpu(lambda: reference(compute, *ops), GPU_TIMING, True))

    def tensor(self, buf: GBuf) -> torch.Tensor:
        return self.arena[buf.offset: buf.offset + buf.size]

    def constant(self, const: Const) -> torch.Tensor:
        return self.consts[const.index]

    def kernel_call(self, step: GpuStep) -> Callable[[], None]:
        k = step.kernel
        if step.binary not in self._loaded:
            self._loaded[step.binary] = self._load(step.binary, k.name)
        fn = self._loaded[step.binary].fn
        args = tuple(self._consts_cp[o.index] if isinstance(o, Const) else
                     self._arena_cp[o.offset: o.offset + o.size]
                     for o in step.operands + [step.out])
        return lambda: fn(k.grid, k.block, args, shared_mem=k.smem_bytes)

    def timer(self, run: Callable[[], None]) -> Callable[[int], float]:

        return device.event_timer(run, device.cupy())


class GpuNetwork(Reporting):
    """A network compiled for the GPU. Call it like the model: torch tensors in (on any
    device), torch tensors out on the first input's device."""

    def __init__(self, plan: GpuPlan, device: Device):
        self.plan, self.part, self.steps, self.device = plan, plan.part, plan.steps, device
        self.estimated_s = plan.estimated_s
        self._in_views = [self.view(b) for b in plan.inputs]
        self._out_views = [self.view(b) for b in plan.outputs]
        self._calls = [self._bind(s) for s in plan.steps]

    def view(self, buf: GBuf) -> torch.Tensor:
        """A buffer as a tensor in its physical (stored) shape."""
        return self.device.tensor(buf).view(physical_shape(buf.shape, buf.layout))

    def _operand(self, o) -> torch.Tensor:
        return self.device.constant(o) if isinstance(o, Const) else self.view(o)

    def _bind(self, s: GpuStep) -> Callable[[], None]:
        if s.kernel is not None:
            return self.device.kernel_call(s)
        ins, out, fn = [self._operand(o) for o in s.operands], self.device.tensor(s.out), s.fn

        def call() -> None:
            out.copy_(fn(*ins).reshape(-1))  # row-major order of the result = stored order
        return call

    def __call__(self, *inputs: torch.Tensor):
        if len(inputs) != len(self._in_views):
            raise ValueError(f"expected {len(self._in_views)} input(s), got {len(inputs)}")
        for x, view, (name, _) in zip(inputs, self._in_views, self.part.graph.inputs):
            if tuple(x.shape) != tuple(view.shape):
                raise ValueError(f"input {name}: shape {tuple(x.shape)}, compiled for "
                                 f"{tuple(view.shape)}")
        with torch.no_grad(), torch_gpu_mode():
            for x, view in zip(inputs, self._in_views):
                view.copy_(x)
            self._run()
            outs = [v.to(inputs[0].device, copy=True) for v in self._out_views]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run(self) -> None:
        for call in self._calls:
            call()

    def benchmark(self, opts: TimingOptions = TimingOptions(warmup=10, min_repeat_ms=100,
                                                            repeats=7)) -> float:
        """Median seconds per inference, timed by the device's clock (CUDA events on a
        GPU) around the launches alone: inputs are random and already on the device,
        warm-up, `number` grown to min_repeat_ms per repeat, the median of the repeats."""
        g = torch.Generator().manual_seed(0)
        with torch.no_grad(), torch_gpu_mode():
            for view in self._in_views:
                view.copy_(torch.randn(view.shape, generator=g))
            for _ in range(opts.warmup):
                self._run()
            return median(time_runs(self.device.timer(self._run), opts))

    def profile(self, png: str | None = None, print_table: bool = True,
                opts: TimingOptions = TimingOptions(warmup=3, min_repeat_ms=10, repeats=5)
                ) -> Profile:
        """Per-step table: each step timed alone by the device's clock (launches are
        asynchronous, so a step is not clocked apart inside a run: ours = alone here),
        next to PyTorch's kernel for the same task on the same device tensors, and the
        record's time; end to end from benchmark(). Prints it, optionally saves a chart."""
        end_to_end = self.benchmark(TimingOptions(opts.warmup, opts.min_repeat_ms * 10,
                                                  opts.repeats))
        rows = []
        with torch.no_grad(), torch_gpu_mode():
            for s, call in zip(self.steps, self._calls):
                alone = self._time(call, opts)
                ref = self._torch_time(s, opts) if s.key is not None else None
                rows.append(ProfileRow(s.name, s.kind, s.layers, alone, alone, ref,
                                       s.estimate))
        prof = Profile(rows, end_to_end, sum(r.torch_s or 0.0 for r in rows))
        if print_table:
            print(prof.table())
        if png:
            prof.save_png(png)
        return prof

    def _time(self, fn: Callable[[], object], opts: TimingOptions) -> float:
        for _ in range(opts.warmup):
            fn()
        return median(time_runs(self.device.timer(fn), opts))

    def _torch_time(self, s: GpuStep, opts: TimingOptions) -> float:
        compute = self.part.task(s.key).compute
        ops = [self._operand(o) if isinstance(o, Const) else
               to_layout(self.view(o), o.layout, NCHW).view(o.shape) for o in s.operands]
        return self._time(lambda: reference(compute, *ops), opts)

    # the CPU network's explanation of estimate vs measurement reads only estimated_s and
    # profile(), which this class has in the same form

    def first_divergence(self, inputs, atol: float = 1e-3) -> str:
        """Run the steps one at a time next to the references and name the first value that
        disagrees (arena ranges are reused, so each value is compared when written)."""
        env = run_steps(self.part, inputs)
        with torch.no_grad(), torch_gpu_mode():
            for x, view in zip(inputs, self._in_views):
                view.copy_(x)
            for s, call in zip(self.steps, self._calls):
                call()
                if id(s) not in self.plan.value_of:
                    continue
                value, layout = self.plan.value_of[id(s)]
                got = to_layout(self.view(s.out).cpu(), layout, NCHW).reshape(env[value].shape)
                err = (got - env[value]).abs().max().item()
                if not err <= atol:
                    return (f"first divergence at step {s.name} ({s.kind}, task {s.key}, value "
                            f"{value}, max abs error {err:.3g})")
        return f"no single step diverges beyond {atol}; the error accumulates"


def check_gpu_network(net: GpuNetwork, model, inputs, atol: float) -> None:
    """net(x) against model(x) on the CPU; on a mismatch, name the first step whose value
    diverges from the tasks' references."""
    with torch.no_grad():
        want = model(*inputs)
    got = net(*inputs)
    wants = want if isinstance(want, (tuple, list)) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    err = max((g.cpu() - w).abs().max().item() for g, w in zip(gots, wants))
    if err <= atol and all(torch.isfinite(g).all() for g in gots):
        return
    raise CompileError(f"compiled GPU network differs from the model: max abs error "
                       f"{err:.3g} (limit {atol}); {net.first_divergence(inputs, atol)}")


# ------------------------------------------------------------------------ compile_network

def cuda_records(records: "str | Iterable[Record]", arch: str, plain_ok: bool) -> list[Record]:
    """The records measured for `arch` ("cuda -arch=ARCH"; plain "cuda" ones too when
    `plain_ok`: the caller's GPU is the arch they were measured on)."""
    if isinstance(records, str):
        if not os.path.exists(records):
            raise CompileError(f"records file {records!r} does not exist")
        records = load_records(records).records
    wanted = {f"cuda -arch={arch}"} | ({"cuda"} if plain_ok else set())
    return [r for r in records if r.target in wanted]


def _missing(part: Partition, best: dict[str, Record]) -> list[str]:
    out = []
    for step in part.steps:
        if isinstance(step, TaskStep) and step.key not in best:
            c = part.task(step.key).compute
            why = cuda_unsupported_reason(c)
            out.append(f"layer {step.layer}: {c.describe()} (task {step.key})"
                       + (f", which has no CUDA kernel: {why}" if why else ""))
    return out


def _arch(tgt: Target) -> str:
    if tgt.arch:
        return tgt.arch

    if device.gpu_count() == 0:
        raise CompileError("target 'cuda' without -arch needs a visible GPU to name its "
                           "arch; pass 'cuda -arch=sm_XY'")
    return device.device_arch()


def compile_network_cuda(model: torch.nn.Module,
                         example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                         records: "str | Iterable[Record]", target: "str | Target" = "cuda",
                         fallback: str | None = None, check: bool = True, atol: float = 1e-3,
                         verbose: bool = False, layout: str = "ilp",
                         time_limit_s: float = 20.0,
                         device: "type[Device] | None" = None,
                         solver: Solver = solve_ilp) -> GpuNetwork:
    """Compile `model` for a cuda target from the records for its arch.

    Each step runs the best record of the layout the layout ILP gives it (layout="ilp"),
    or of one layout for the whole network where it has one ("uniform"); transforms
    between layouts are timed on the device. A task without a record is an error naming
    its layer; with fallback="torch" it runs torch's kernel on the GPU tensors, and so
    does any step where torch's kernel, timed on the device, is faster. With `check`,
    the output is compared with model(x) (max abs error <= atol) and the first diverging
    step named. `device` is the executor class (default: CupyDevice on the current GPU;
    tests pass an emulator): it times transforms and torch's kernels, and runs the plan."""
    tgt = parse_target(target)
    if fallback not in (None, TORCH):
        raise CompileError(f"fallback must be None or 'torch', got {fallback!r}")
    if layout not in ("ilp", "uniform"):
        raise CompileError(f"layout must be 'ilp' or 'uniform', got {layout!r}")
    arch = _arch(tgt)
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) \
        else tuple(example_inputs)
    recs = cuda_records(records, arch, plain_ok=tgt.arch is None)
    best = best_per_task(recs)
    part = partition(capture(model, inputs))
    missing = _missing(part, best)
    if missing and fallback is None:
        raise CompileError(f"no cuda record for {arch} for {len(missing)} step(s): "
                           + "; ".join(missing[:5]) + ("; ..." if len(missing) > 5 else "")
                           + ". Tune them, or pass fallback='torch' to run PyTorch's kernels")
    if device is None:
        device = _gpu_device()
    torch_s = None
    if fallback:
        torch_s = {t.key: device.torch_seconds(t.compute) for t in part.tasks}
    cands = step_candidates(part, recs, torch_s)
    layout_plan, chosen = choose_layouts(part, cands, layout, device.transform_seconds,
                                         time_limit_s, solver)
    plan = plan_network(part, chosen, arch, estimated_latency(part, best, torch_s),
                        layout_plan)
    net = GpuNetwork(plan, device(plan))
    if verbose:
        print("compiled " + plan.summary())
    if check:
        check_gpu_network(net, model, inputs, atol)
    return net


def _gpu_device() -> "type[Device]":
    """CupyDevice, or an error saying what is missing to run on a GPU."""

    if device.gpu_count() == 0:
        raise CompileError("a cuda network runs on a CUDA GPU, and cupy sees none here")
    if not torch.cuda.is_available():
        raise CompileError("torch in this environment has no CUDA: the network's torch "
                           "steps and its inputs and outputs need torch CUDA tensors")
    return CupyDevice
