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

Layouts: every CUDA kernel today reads and writes torch's contiguous layout (NCHW for
activations; codegen/cuda_kernel.py), so no transform is planned between two kernels. The
planner still asks each kernel for its layouts and, where consecutive steps disagree,
inserts a torch permute + contiguous copy on the device (`to_layout`): correct, but not a
tuned transform kernel. The layout ILP of the CPU path is not applied to GPU graphs yet.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np
import torch

from .codegen.cuda_build import compile_cuda, resource_problems
from .codegen.cuda_kernel import CudaKernel
from .codegen.cuda_render import cuda_unsupported_reason, render_cuda
from .codegen.space import Config
from .frontend import capture
from .network import CompileError, CompiledNetwork, Profile, ProfileRow  # imports us lazily
from .partition import GlueStep, Partition, TaskStep, partition, run_glue, run_steps
from .records import Record, best_per_task, load_records
from .reference import reference
from .target import Target, parse_target
from .timing import TimingOptions, median, time_runs

NCHW, NHWC = "NCHW", "NHWC"
KERNEL_LAYOUT = NCHW  # what every CUDA kernel reads and writes (cuda_kernel.py)
ALIGN = 64  # floats: arena offsets on 256 bytes, as cudaMalloc aligns (float4 loads)
TORCH = "torch"


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

    def summary(self) -> str:
        kinds = [s.kind for s in self.steps]
        return (f"{len(self.steps)} steps on {self.arch} ("
                + ", ".join(f"{kinds.count(k)} {k}" for k in sorted(set(kinds)))
                + f"); arena {self.arena_floats * 4 / 2**20:.2f} MiB, constants "
                f"{sum(c.nbytes for c in self.consts) / 2**20:.2f} MiB")


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


def kernel_layouts(compute, kernel: CudaKernel) -> tuple[str, str]:
    """(first input's layout, output layout) of a task's CUDA kernel: contiguous for all
    of today's kernels; the one place to change when a kernel family learns another."""
    return KERNEL_LAYOUT, KERNEL_LAYOUT


class _Planner:
    def __init__(self, part: Partition, arch: str, best: dict[str, Record],
                 layouts: Callable[..., tuple[str, str]] = kernel_layouts):
        self.part, self.graph, self.arch, self.best = part, part.graph, arch, best
        self.layouts = layouts
        self.steps: list[GpuStep] = []
        self.consts: list[np.ndarray] = []
        self.const_of: dict[str, Const] = {}
        self.produced: dict[str, tuple[GBuf, str]] = {}
        self.copies: dict[tuple[str, str], GBuf] = {}
        self.built: dict[tuple[str, Config], tuple[CudaKernel, bytes]] = {}
        self.value_of: dict[int, tuple[str, str]] = {}
        self.aliases: list[GBuf] = []
        self.inputs = [GBuf(math.prod(s), tuple(s), pinned=True) for _, s in self.graph.inputs]
        for (name, _), buf in zip(self.graph.inputs, self.inputs):
            self.produced[name] = (buf, NCHW)

    def const(self, name: str) -> Const:
        if name not in self.const_of:
            p = self.graph.params[name].detach().cpu()
            self.consts.append(np.ascontiguousarray(p.numpy()))
            self.const_of[name] = Const(len(self.consts) - 1)
        return self.const_of[name]

    def value(self, name: str, layout: str) -> GBuf:
        """`name` stored in `layout`, through a (cached) torch transform when needed."""
        buf, have = self.produced[name]
        if have == layout:
            return buf
        if (name, layout) not in self.copies:
            physical_shape(buf.shape, layout)  # fails early for a layout we cannot store
            out = GBuf(buf.size, buf.shape, layout)
            fn = lambda x, a=have, b=layout: to_layout(x, a, b)  # noqa: E731
            self.steps.append(GpuStep(f"{name}: {have} -> {layout}", "transform", (),
                                      [buf], out, fn=fn))
            self.copies[(name, layout)] = out
        return self.copies[(name, layout)]

    def operand(self, name: str, layout: str = NCHW) -> "GBuf | Const":
        return self.const(name) if name in self.graph.params else self.value(name, layout)

    def task(self, step: TaskStep) -> None:
        compute = self.part.task(step.key).compute
        rec = self.best.get(step.key)
        if rec is None:  # fallback="torch" (missing records were refused before planning)
            ops = [self.operand(a) for a in step.args]
            out = GBuf(compute.output.numel, compute.output.shape)
            fn = lambda *xs, c=compute: reference(c, *xs)  # noqa: E731
            self._add(GpuStep(step.layer, TORCH, (step.layer,), ops, out, key=step.key, fn=fn),
                      step.output)
            return
        kernel, binary = self._build(step, compute, Config.from_json(rec.config))
        in_layout, out_layout = self.layouts(compute, kernel)
        if len(step.args) != len(kernel.buffers) - 1:
            raise CompileError(f"{step.layer}: {len(step.args)} operands for the "
                               f"{len(kernel.buffers) - 1} input buffers of task "
                               f"{step.key}'s kernel")
        ops = []
        for i, (arg, kb) in enumerate(zip(step.args, kernel.buffers)):
            op = self.operand(arg, in_layout if i == 0 else NCHW)
            size = self.consts[op.index].size if isinstance(op, Const) else op.size
            if size != kb.size:
                raise CompileError(f"{step.layer}: operand {arg} holds {size} floats, kernel "
                                   f"buffer {kb.name} of task {step.key} reads {kb.size}")
            ops.append(op)
        out = GBuf(compute.output.numel, compute.output.shape, out_layout)
        self._add(GpuStep(step.layer, "kernel", (step.layer,), ops, out, rec.median, step.key,
                          kernel, binary), step.output)

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


def plan_network(part: Partition, best: dict[str, Record], arch: str,
                 layouts: Callable[..., tuple[str, str]] = kernel_layouts) -> GpuPlan:
    """The plan of a partitioned graph from the chosen record of each task (a task absent
    from `best` runs in torch); builds every kernel with NVRTC for `arch`."""
    planner = _Planner(part, arch, best, layouts)
    for step in part.steps:
        if isinstance(step, TaskStep):
            planner.task(step)
        else:
            planner.glue(step)
    outputs = planner.outputs()
    arena = assign_offsets(planner.steps, planner.inputs + outputs, planner.aliases)
    estimated = sum(t.weight * best[t.key].median for t in part.tasks if t.key in best)
    return GpuPlan(arch, part, planner.steps, planner.inputs, outputs, planner.consts,
                   arena, planner.value_of, estimated)


# ------------------------------------------------------------------------ the execution

class Device(Protocol):
    """Memory and launches for a plan: the GPU (CupyDevice), or an emulator in tests."""

    def tensor(self, buf: GBuf) -> torch.Tensor:
        """The buffer's `size` floats as a flat torch tensor sharing its memory."""

    def constant(self, const: Const) -> torch.Tensor:
        """The packed constant, shaped as the parameter it came from, on the device."""

    def kernel_call(self, step: GpuStep) -> Callable[[], None]:
        """A call that enqueues the step's launch (its arguments bound once)."""

    def timer(self, run: Callable[[], None]) -> Callable[[int], float]:
        """run(number) -> seconds for `number` calls of run, by the device's clock."""


def _cupy():
    import cupy  # a heavy optional dependency: only where a GPU is used

    return cupy


class CupyDevice:
    """The plan on the current CUDA device (torch's and cupy's must be the same one; GPU 0
    unless set): one torch allocation for the arena, one per constant, each cubin loaded
    once (cupy RawModule), each launch's arguments made once as cupy views."""

    def __init__(self, plan: GpuPlan):
        from .measure_gpu import LoadedKernel

        cp = _cupy()
        self.dev = torch.device("cuda", torch.cuda.current_device())
        if cp.cuda.Device().id != self.dev.index:
            raise CompileError(f"torch's current CUDA device is {self.dev.index}, cupy's "
                               f"{cp.cuda.Device().id}: set both to the same GPU")
        self.arena = torch.zeros(max(plan.arena_floats, 1), device=self.dev)
        self._arena_cp = cp.asarray(self.arena)  # the same memory
        self.consts = [torch.from_numpy(c).to(self.dev) for c in plan.consts]
        self._consts_cp = [cp.asarray(c.reshape(-1)) for c in self.consts]
        self._loaded: dict[bytes, object] = {}
        self._load = LoadedKernel

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
        from .measure_gpu import event_timer

        return event_timer(run, _cupy())


class GpuNetwork:
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
        with torch.no_grad(), _true_float32():
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
        with torch.no_grad(), _true_float32():
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
        with torch.no_grad(), _true_float32():
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
    fidelity = CompiledNetwork.fidelity


class _true_float32:
    """TF32 off while torch steps run (the checks compare with true float32)."""

    def __enter__(self):
        self.old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.old


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
                       f"{err:.3g} (limit {atol}); {first_gpu_divergence(net, inputs, atol)}")


def first_gpu_divergence(net: GpuNetwork, inputs, atol: float = 1e-3) -> str:
    """Run the steps one at a time next to the references and name the first value that
    disagrees (arena ranges are reused, so each value is compared when written)."""
    env = run_steps(net.part, inputs)
    with torch.no_grad(), _true_float32():
        for x, view in zip(inputs, net._in_views):
            view.copy_(x)
        for s, call in zip(net.steps, net._calls):
            call()
            if id(s) not in net.plan.value_of:
                continue
            value, layout = net.plan.value_of[id(s)]
            got = to_layout(net.view(s.out).cpu(), layout, NCHW).reshape(env[value].shape)
            err = (got - env[value]).abs().max().item()
            if not err <= atol:
                return (f"first divergence at step {s.name} ({s.kind}, task {s.key}, value "
                        f"{value}, max abs error {err:.3g})")
    return f"no single step diverges beyond {atol}; the error accumulates"


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
    from .measure_gpu import device_arch, gpu_count

    if gpu_count() == 0:
        raise CompileError("target 'cuda' without -arch needs a visible GPU to name its "
                           "arch; pass 'cuda -arch=sm_XY'")
    return device_arch()


def compile_network_cuda(model: torch.nn.Module,
                         example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                         records: "str | Iterable[Record]", target: "str | Target" = "cuda",
                         fallback: str | None = None, check: bool = True, atol: float = 1e-3,
                         verbose: bool = False,
                         device: Callable[[GpuPlan], Device] | None = None) -> GpuNetwork:
    """Compile `model` for a cuda target from the best record of each task for its arch.

    A task without a record is an error naming its layer, or with fallback="torch" runs
    torch's kernel on the GPU tensors. With `check`, the output is compared with model(x)
    (max abs error <= atol) and the first diverging step named. `device` makes the
    executor of the plan (default: CupyDevice on GPU 0; tests pass an emulator)."""
    tgt = parse_target(target)
    if fallback not in (None, TORCH):
        raise CompileError(f"fallback must be None or 'torch', got {fallback!r}")
    arch = _arch(tgt)
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) \
        else tuple(example_inputs)
    best = best_per_task(cuda_records(records, arch, plain_ok=tgt.arch is None))
    part = partition(capture(model, inputs))
    missing = _missing(part, best)
    if missing and fallback is None:
        raise CompileError(f"no cuda record for {arch} for {len(missing)} step(s): "
                           + "; ".join(missing[:5]) + ("; ..." if len(missing) > 5 else "")
                           + ". Tune them, or pass fallback='torch' to run PyTorch's kernels")
    if device is None:
        device = _gpu_device()
    plan = plan_network(part, best, arch)
    net = GpuNetwork(plan, device(plan))
    if verbose:
        print("compiled " + plan.summary())
    if check:
        check_gpu_network(net, model, inputs, atol)
    return net


def _gpu_device() -> Callable[[GpuPlan], Device]:
    """CupyDevice, or an error saying what is missing to run on a GPU."""
    from .measure_gpu import gpu_count

    if gpu_count() == 0:
        raise CompileError("a cuda network runs on a CUDA GPU, and cupy sees none here")
    if not torch.cuda.is_available():
        raise CompileError("torch in this environment has no CUDA: the network's torch "
                           "steps and its inputs and outputs need torch CUDA tensors")
    return CupyDevice
