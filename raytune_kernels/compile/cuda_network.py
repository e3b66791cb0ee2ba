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

The plan is made in compile/cuda_plan.py; this module runs it.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Callable, Iterable, Protocol, Sequence

import torch

from raytune_kernels.cuda.render import cuda_layouts, cuda_unsupported_reason, default_config
from raytune_kernels.cuda.gpu import gpu_info
from raytune_kernels.frontend.capture import capture
from raytune_kernels.layout.problem import solve_ilp
from raytune_kernels.compile.choose import TORCH, Solver, estimated_latency
from raytune_kernels.layout.graph import Candidate
from raytune_kernels.compile.cuda_plan import (NCHW, Const, GBuf, GpuPlan, GpuStep,
                                               choose_layouts, physical_shape, plan_network,
                                               step_candidates, to_layout)
from raytune_kernels.compile.artifact import graph_without_weights, save
from raytune_kernels.compile.report import (Profile, ProfileRow, Reporting, held_to,
                                            output_error, random_inputs, scaled_error)
from raytune_kernels.errors import CompileError
from raytune_kernels.frontend.partition import Partition, TaskStep, partition, run_steps
from raytune_kernels.tune.records import Record, best_per_task
from raytune_kernels.measure import MeasureOptions, random_operands
from raytune_kernels.frontend.reference import reference
from raytune_kernels.target import Target, parse_target
from raytune_kernels.precision import DEFAULT
from raytune_kernels.timing import TimingOptions, median, time_runs
from raytune_kernels.cuda import device
from raytune_kernels.cuda.device import torch_gpu_mode
from raytune_kernels.cuda.torch_timing import time_torch_gpu


# ------------------------------------------------------------------------ the execution

GPU_TIMING = MeasureOptions().timing()  # transforms and torch's kernels, timed as records

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

    def kernel_call(self, step: GpuStep, weights_copies: int = 1) -> Callable[[], None]:
        """A call that enqueues the step's launch (its arguments bound once); with
        `weights_copies` > 1, each launch reads the next of that many copies of the step's
        weights (operand 1), as records are timed."""

    @staticmethod
    def cache_bytes() -> int:
        """The cache a kernel's weights must be read past to come from memory (the L2)."""

    def timer(self, run: Callable[[], None]) -> Callable[[int], float]:
        """run(number) -> seconds for `number` calls of run, by the device's clock (for a
        whole network's replay)."""

    def graph_timer(self, run: Callable[[], None]) -> Callable[[int], float]:
        """The same, the calls replayed from one captured graph, as a step runs inside the
        network's graph."""

    def capture(self, run: Callable[[], None]) -> Callable[[], None]:
        """A call that replays everything run() enqueues, as one graph of launches."""


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
        return median(time_torch_gpu(lambda: to_layout(x, src, dst), GPU_TIMING, True,
                                     graphed=True))

    @staticmethod
    def torch_seconds(compute) -> float:
        ops = [x.cuda() for x in random_operands(compute)]
        return median(time_torch_gpu(lambda: reference(compute, *ops), GPU_TIMING, True,
                                     graphed=True))

    def tensor(self, buf: GBuf) -> torch.Tensor:
        return self.arena[buf.offset: buf.offset + buf.size]

    def constant(self, const: Const) -> torch.Tensor:
        return self.consts[const.index]

    def kernel_call(self, step: GpuStep, weights_copies: int = 1) -> Callable[[], None]:
        k = step.kernel
        if step.binary not in self._loaded:
            self._loaded[step.binary] = self._load(step.binary, k.name)
        fn = self._loaded[step.binary].fn
        args = tuple(self._consts_cp[o.index] if isinstance(o, Const) else
                     self._arena_cp[o.offset: o.offset + o.size]
                     for o in step.operands + [step.out])
        if weights_copies > 1:
            return device.rotating_call(fn, k, args, 1, weights_copies)
        return lambda: fn(k.grid, k.block, args, shared_mem=k.smem_bytes)

    @staticmethod
    def cache_bytes() -> int:
        return device.l2_bytes(device.cupy())

    def timer(self, run: Callable[[], None]) -> Callable[[int], float]:
        return device.event_timer(run, device.cupy())

    def graph_timer(self, run: Callable[[], None]) -> Callable[[int], float]:
        def capture(number: int) -> Callable[[], None]:
            def calls() -> None:
                for _ in range(number):
                    run()
            return self.capture(calls)
        return device.graph_timer(capture, device.cupy())

    def capture(self, run: Callable[[], None]) -> Callable[[], None]:
        """run()'s launches (cupy's kernels and torch's steps) as one CUDA graph, replayed
        on torch's current stream. Warmed up first on a side stream, so that lazy module
        loads and torch's first allocations happen outside the capture; inside it, cupy
        launches on torch's capture stream and torch allocates from the graph's pool."""
        cp = device.cupy()
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side), cp.cuda.ExternalStream(side.cuda_stream):
            for _ in range(3):
                run()
        torch.cuda.current_stream(self.dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            with cp.cuda.ExternalStream(torch.cuda.current_stream(self.dev).cuda_stream):
                run()
        torch.cuda.synchronize(self.dev)
        return graph.replay


class GpuNetwork(Reporting):
    """A network compiled for the GPU. Call it like the model: torch tensors in (on any
    device), torch tensors out on the first input's device."""

    examples: "Sequence[torch.Tensor] | None" = None  # the inputs it was compiled with
    compile_phases: dict[str, float] | None = None  # seconds of each compile phase, in order

    def __init__(self, plan: GpuPlan, device: Device, graph: bool = False):
        self.plan, self.part, self.steps, self.device = plan, plan.part, plan.steps, device
        self.estimated_s = plan.estimated_s
        self._in_views = [self.view(b) for b in plan.inputs]
        self._out_views = [self.view(b) for b in plan.outputs]
        self._calls = [self._bind(s) for s in plan.steps]
        self._replay: Callable[[], None] | None = None
        if graph:
            self._replay = self._capture()

    @property
    def graph(self) -> bool:
        """Whether a call replays one captured graph (else the steps launch one by one)."""
        return self._replay is not None

    def _capture(self) -> Callable[[], None]:
        try:
            with torch.no_grad(), torch_gpu_mode():
                return self.device.capture(self._launch_steps)
        except Exception as exc:
            raise CompileError(f"capturing the network as one CUDA graph failed "
                               f"({type(exc).__name__}: {exc}); compile with graph=False "
                               "to launch its steps one by one") from exc

    def save(self, path: str) -> None:
        """Write the network to one file (compile/artifact.py): raytune_kernels.load(path)
        runs it on a GPU of the same arch with neither Ray, XGBoost, PuLP nor records."""
        save(path, self.state(), {"kind": "cuda", "arch": self.plan.arch})

    def state(self) -> dict:
        """The plan (cubins, packed constants, offsets, torch steps) a saved file holds."""
        index = {id(s): i for i, s in enumerate(self.plan.steps)}
        part = dataclasses.replace(self.plan.part,
                                   graph=graph_without_weights(self.plan.part.graph))
        plan = dataclasses.replace(self.plan, part=part, value_of={
            index[k]: v for k, v in self.plan.value_of.items()})
        return {"plan": plan, "graph": self.graph, "examples": self.examples}

    @classmethod
    def from_state(cls, state: dict, device: "type[Device] | None" = None) -> "GpuNetwork":
        """The network of a saved state on `device` (default: this machine's GPU)."""
        plan = state["plan"]
        plan = dataclasses.replace(plan, value_of={id(plan.steps[i]): v for i, v in
                                                   plan.value_of.items()})
        device = device or _gpu_device()
        net = cls(plan, device(plan), graph=state["graph"])
        net.examples = state["examples"]
        return net

    def random_inputs(self, seed: int = 0) -> list[torch.Tensor]:
        """Random inputs of the compiled shapes (token ids in the examples' range)."""
        return random_inputs([v.shape for v in self._in_views], self.examples, seed)

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
        if self._replay is not None:
            self._replay()
        else:
            self._launch_steps()

    def _launch_steps(self) -> None:
        for call in self._calls:
            call()

    def benchmark(self, opts: TimingOptions = TimingOptions(warmup=10, min_repeat_ms=100,
                                                            repeats=7)) -> float:
        """Median seconds per inference, timed by the device's clock (CUDA events on a
        GPU) around the launches alone: inputs are random and already on the device,
        warm-up, `number` grown to min_repeat_ms per repeat, the median of the repeats."""
        xs = random_inputs([v.shape for v in self._in_views], self.examples)
        with torch.no_grad(), torch_gpu_mode():
            for view, x in zip(self._in_views, xs):
                view.copy_(x)
            for _ in range(opts.warmup):
                self._run()
            return median(time_runs(self.device.timer(self._run), opts))

    def profile(self, png: str | None = None, print_table: bool = True,
                opts: TimingOptions = TimingOptions(warmup=3, min_repeat_ms=10, repeats=5),
                with_torch: bool = True, end_to_end: float | None = None) -> Profile:
        """Per-step table: each step timed alone by the device's clock, its calls replayed
        from one graph as the network replays it, a conv's or dense's weights read from
        rotating copies as its records were timed (launches are asynchronous, so a step is
        not clocked apart inside a run: ours = alone here),
        next to PyTorch's kernel for the same task on the same device, and the
        record's time; end to end from benchmark(). Prints it, optionally saves a chart."""
        if end_to_end is None:
            end_to_end = self.benchmark(TimingOptions(opts.warmup, opts.min_repeat_ms * 10,
                                                      opts.repeats))
        rows = []
        with torch.no_grad(), torch_gpu_mode():
            for s, call in zip(self.steps, self._calls):
                alone = self._time(self._cold(s) or call, opts)
                ref = self._torch_time(s, opts) if with_torch and s.key is not None else None
                rows.append(ProfileRow(s.name, s.kind, s.layers, alone, alone, ref,
                                       s.estimate))
        prof = Profile(rows, end_to_end, sum(r.torch_s or 0.0 for r in rows))
        if print_table:
            print(prof.table())
        if png:
            prof.save_png(png)
        return prof

    def _cold(self, s: GpuStep) -> Callable[[], None] | None:
        """A conv's or dense's launch reading its weights from rotating copies that cover
        twice the L2, as its records were timed (cuda/measure.py); None for other steps."""
        if s.kernel is None or s.key is None or len(s.operands) < 2 or \
                not isinstance(s.operands[1], Const) or \
                self.part.task(s.key).compute.op not in ("conv2d", "dense"):
            return None
        weights = self.device.constant(s.operands[1])
        copies = device.weight_copies(weights.numel() * 4, self.device.cache_bytes())
        return self.device.kernel_call(s, copies)

    def _time(self, fn: Callable[[], object], opts: TimingOptions) -> float:
        for _ in range(opts.warmup):
            fn()
        return median(time_runs(self.device.graph_timer(fn), opts))

    def _torch_time(self, s: GpuStep, opts: TimingOptions) -> float:
        """PyTorch's kernel for the step's task, on random operands in torch's layouts (the
        plan's constants are packed for our kernels: an NHWC convolution's weight is OHWI,
        which torch would read as another convolution), timed as the records are; a
        kernel of sibling denses against that many of torch's."""
        return self.device.torch_seconds(self.part.task(s.key).compute) * max(1, len(s.parts))

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
                done = [(value, buf, NCHW) for value, buf in s.parts]  # sibling denses
                if id(s) in self.plan.value_of:
                    value, layout = self.plan.value_of[id(s)]
                    done.append((value, s.out, layout))
                for value, buf, layout in done:
                    got = to_layout(self.view(buf).cpu(), layout, NCHW).reshape(
                        env[value].shape)
                    err = scaled_error(got, env[value])
                    if not err <= atol:
                        return (f"first divergence at step {s.name} ({s.kind}, task {s.key}, "
                                f"value {value}, error {err:.3g} of the value's scale)")
        return f"no single step diverges beyond {atol}; the error accumulates"


def check_gpu_network(net: GpuNetwork, model, inputs, atol: float | None = None,
                      precision: str = DEFAULT) -> float:
    """net(x) against model(x) on the CPU, within `atol` of the output's scale or, without
    one, the bound of `precision` for this model (report.held_to); on a mismatch, name the
    first step whose value diverges from the tasks' references. Returns the bound."""
    with torch.no_grad():
        want = model(*inputs)
    got = net(*inputs)
    err = output_error(got, want)
    atol, why = held_to(err, model, inputs, precision, atol)
    if err <= atol:
        return atol
    limit = f"{atol:.3g}: {why}" if why else f"{atol}"
    raise CompileError(f"compiled GPU network differs from the model: error {err:.3g} of "
                       f"the output's scale (limit {limit}); "
                       f"{net.first_divergence(inputs, atol)}")


# ------------------------------------------------------------------------ compile_network

def _without_kernel(part: Partition, best: dict[str, Record]) -> list[str]:
    """The steps without a record whose task has no CUDA kernel at all (an untuned
    default cannot run them either), named by layer and reason."""
    out = []
    for step in part.steps:
        if isinstance(step, TaskStep) and step.key not in best:
            c = part.task(step.key).compute
            why = cuda_unsupported_reason(c)
            if why:
                out.append(f"layer {step.layer}: {c.describe()} (task {step.key}), which "
                           f"has no CUDA kernel: {why}")
    return out


def target_arch(tgt: Target) -> str:
    """The arch a cuda target compiles for: its -arch, or the visible GPU's."""
    if tgt.arch:
        return tgt.arch

    if device.gpu_count() == 0:
        raise CompileError("target 'cuda' without -arch needs a visible GPU to name its "
                           "arch; pass 'cuda -arch=sm_XY'")
    return device.device_arch()


def compile_network_cuda(model: torch.nn.Module,
                         example_inputs: "Sequence[torch.Tensor] | torch.Tensor",
                         records: Iterable[Record] = (),
                         target: "str | Target" = "cuda",
                         fallback: str | None = None, check: bool = True,
                         atol: float | None = None,
                         verbose: bool = False, layout: str = "ilp",
                         time_limit_s: float = 20.0,
                         device: "type[Device] | None" = None,
                         solver: Solver = solve_ilp, graph: bool = True,
                         rewrites: bool = True) -> GpuNetwork:
    """Compile `model` for a cuda target from `records`, those of its arch and precision
    (compile.api.cuda_records picks them).

    Each step runs the best record of the layout the layout ILP gives it (layout="ilp"),
    or of one layout for the whole network where it has one ("uniform"); transforms
    between layouts are timed on the device. A task without a record runs an untuned
    default config (cuda.render.default_config: chosen by rule, not measured, so left out
    of the estimate), named in one warning; with fallback="torch" it runs torch's kernel
    on the GPU tensors instead, and so does any step where torch's kernel, timed on the
    device, is faster. A task with no CUDA kernel at all is an error naming its layer,
    unless fallback="torch". With `check`, the output is compared with model(x)
    (difference <= atol of its scale; by default the bound of the target's precision for
    this model, report.held_to) and the first diverging step named. `device` is the
    executor class (default: CupyDevice on the current GPU; tests pass an emulator): it
    times transforms and torch's kernels, and runs the plan. With `graph` (and a device
    that can capture), every call replays the whole network as one CUDA graph captured
    here; graph=False launches step by step (for debugging and per-step profiling).
    `rewrites` (cuda_plan.plan_network): sibling denses as one kernel, attention's permutes
    read and written in place, tf32 weights rounded at packing; rewrites=False plans each
    step as its own launch or copy (the baseline they must beat, and for debugging)."""
    tgt = parse_target(target)
    if fallback not in (None, TORCH):
        raise CompileError(f"fallback must be None or 'torch', got {fallback!r}")
    if layout not in ("ilp", "uniform"):
        raise CompileError(f"layout must be 'ilp' or 'uniform', got {layout!r}")
    arch = target_arch(tgt)
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) \
        else tuple(example_inputs)
    clock = _Phases()
    recs = list(records)
    best = best_per_task(recs)
    part = partition(capture(model, inputs))
    clock.lap("capture")
    missing = _without_kernel(part, best)
    if missing and fallback is None:
        raise CompileError(f"no CUDA kernel for {len(missing)} step(s): "
                           + "; ".join(missing[:5]) + ("; ..." if len(missing) > 5 else "")
                           + ". Pass fallback='torch' to run PyTorch's kernels for them")
    untuned = [] if fallback else [t for t in part.tasks if t.key not in best]
    if untuned:
        warnings.warn(f"{len(untuned)} task(s) without a cuda record for {arch} run an "
                      "untuned default config (tune them for speed): "
                      + "; ".join(t.compute.describe() for t in untuned[:5])
                      + ("; ..." if len(untuned) > 5 else ""), stacklevel=3)
    if device is None:
        device = _gpu_device()
    torch_s = None
    if fallback:
        torch_s = {t.key: device.torch_seconds(t.compute) for t in part.tasks}
        clock.lap("torch timed")
    cands = step_candidates(part, recs, torch_s)
    sms = gpu_info(arch).sms  # the arch's figures: the untuned default is a rule
    defaults = {t.key: default_config(t.compute, tgt.precision, sms) for t in untuned}
    for step, options in zip(part.steps, cands):
        if isinstance(step, TaskStep) and step.key in defaults:
            cfg = defaults[step.key]
            options.append(Candidate(*cuda_layouts(part.task(step.key).compute, cfg), 0.0,
                                     cfg))
    layout_plan, chosen = choose_layouts(part, cands, layout, device.transform_seconds,
                                         time_limit_s, solver)
    clock.lap("layouts")
    plan = plan_network(part, chosen, arch, estimated_latency(part, best, torch_s),
                        layout_plan, rewrites)
    clock.lap("build")
    net = GpuNetwork(plan, device(plan), graph=graph)
    net.examples = inputs
    clock.lap("load and capture" if graph else "load")
    if check:
        net.checked_within = check_gpu_network(net, model, inputs, atol, tgt.precision)
        clock.lap("check")
    net.compile_phases = dict(clock.seconds)
    if verbose:
        print("compiled " + plan.summary() + f"; {clock}")
    return net


class _Phases:
    """Seconds of each phase of a compile, in order (what a slow compile spent them on)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def __str__(self) -> str:
        return "took " + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())


def _gpu_device() -> "type[Device]":
    """CupyDevice, or an error saying what is missing to run on a GPU."""

    if device.gpu_count() == 0:
        raise CompileError("a cuda network runs on a CUDA GPU, and cupy sees none here")
    if not torch.cuda.is_available():
        raise CompileError("torch in this environment has no CUDA: the network's torch "
                           "steps and its inputs and outputs need torch CUDA tensors")
    return CupyDevice
