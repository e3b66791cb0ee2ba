"""A tuned GPU network as a plan, pure Python and bytes (tested without a GPU): the best
cuda record of every task for one arch, each kernel rendered and built by NVRTC once,
weights packed once, the torch steps (glue, fallback, layout transforms), every
activation's offset in one arena, launch geometry and step order; and the choice of each
step's kernel by the layout ILP. compile/cuda_network.py runs a plan on a Device."""
from __future__ import annotations

import concurrent.futures
import math
import os
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from raytune_kernels.cuda.build import compile_cuda, resource_problems
from raytune_kernels.cuda.kernel import CudaKernel
from raytune_kernels.cuda import split_k
from raytune_kernels.cuda.gemm_views import Strides, contiguous_strides, gemm_view
from raytune_kernels.cuda.render import (block_tile, cuda_layouts, operand_layouts,
                                         render_cuda, rounds_weights, strided_problem,
                                         to_buffer_layout)
from raytune_kernels.space import Config
from raytune_kernels.task import Compute, EpilogueOp, TensorSpec
from raytune_kernels.layout.problem import LayoutPlan, solve_ilp
from raytune_kernels.layout.graph import Candidate
from raytune_kernels.compile.report import rounded as round_to
from raytune_kernels.compile.step_fns import Glue, Reference
from raytune_kernels.compile.choose import TORCH, Solver, candidates_from_records, choose
from raytune_kernels.errors import CompileError
from raytune_kernels.frontend.partition import GlueStep, Partition, TaskStep
from raytune_kernels.tune.records import Record

NCHW, NHWC = "NCHW", "NHWC"
PREBUILD_THREADS = 16  # NVRTC builds at once while planning (at most one per core)
ALIGN = 64  # floats: arena offsets on 256 bytes, as cudaMalloc aligns (float4 loads)


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
    within: int = 0  # an alias's floats from its buffer's start (one of merged outputs)

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
    # a kernel computing several tasks' steps at once (sibling_denses): each one's value
    # and the part of `out` that holds it
    parts: tuple[tuple[str, GBuf], ...] = ()

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


@dataclass(frozen=True)
class ToLayout:
    """to_layout as a value (a planned transform step pickles with its plan)."""

    src: str
    dst: str

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return to_layout(x, self.src, self.dst)


def same_order(shape: tuple[int, ...], a: str, b: str) -> bool:
    """Whether layouts a and b hold a value's elements in the same memory order (equal,
    or a 4-D value with one channel or one pixel): then changing layout copies nothing."""
    return a == b or (len(shape) == 4 and (shape[1] == 1 or shape[2] * shape[3] == 1))


def tf32(packed: np.ndarray) -> np.ndarray:
    """Packed weights rounded to tf32 as cvt.rna.tf32.f32 rounds them (report.rounded):
    what a kernel rendered with rounded weights reads without converting."""
    return round_to(torch.from_numpy(packed), "tf32").numpy()


class Planner:
    def __init__(self, part: Partition, arch: str, in_place: "InPlace | None" = None,
                 siblings: "dict[str, Siblings] | None" = None, rounding: bool = True):
        self.part, self.graph, self.arch = part, part.graph, arch
        self.rounding = rounding  # tf32 weights rounded at packing (build_key)
        self.in_place = in_place or InPlace(frozenset(), {}, {})
        self.siblings = siblings or {}  # the first's value -> the denses run as one kernel
        self.merged = {s.output for g in self.siblings.values() for s in g.steps[1:]}
        self.read_in_place: dict[str, GBuf] = {}  # a permute's value -> the buffer it views
        self.stacked: dict[tuple, Const] = {}  # sibling parameters, stacked (and rounded)
        self.steps: list[GpuStep] = []
        self.consts: list[np.ndarray] = []
        self.const_of: dict[tuple[str, str, bool], Const] = {}
        self.produced: dict[str, tuple[GBuf, str]] = {}
        self.copies: dict[tuple[str, str], GBuf] = {}
        self.built: dict[tuple, tuple[CudaKernel, bytes]] = {}  # (key, config, strides)
        self.prebuilt: dict[tuple, tuple] = {}  # prebuild's, not yet taken
        self.value_of: dict[int, tuple[str, str]] = {}
        self.aliases: list[GBuf] = []
        self.inputs = [GBuf(math.prod(s), tuple(s), pinned=True) for _, s in self.graph.inputs]
        for (name, _), buf in zip(self.graph.inputs, self.inputs):
            self.produced[name] = (buf, NCHW)

    def const(self, name: str, layout: str = NCHW, rounded: bool = False) -> Const:
        """A parameter packed once per layout (a GEMM conv's NHWC weight is KRSC), and
        rounded to tf32 (`rounded`, for tf32 tensor-core kernels: build_key)."""
        if (name, layout, rounded) not in self.const_of:
            p = self.graph.params[name].detach().cpu().float()
            packed = p if layout == NCHW else to_buffer_layout(p, layout, tuple(p.shape))
            packed = np.ascontiguousarray(packed.numpy())
            self.consts.append(tf32(packed) if rounded else packed)
            self.const_of[(name, layout, rounded)] = Const(len(self.consts) - 1)
        return self.const_of[(name, layout, rounded)]

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
            fn = ToLayout(have, layout)
            self.steps.append(GpuStep(f"{name}: {have} -> {layout}", "transform", (),
                                      [buf], out, fn=fn))
            self.copies[(name, layout)] = out
        return self.copies[(name, layout)]

    def operand(self, name: str, layout: str = NCHW) -> "GBuf | Const":
        return self.const(name, layout) if name in self.graph.params else \
            self.value(name, layout)

    def task(self, step: TaskStep, cand: Candidate) -> None:
        """Plan a task step as its chosen candidate: a config (a kernel) or TORCH."""
        if step.output in self.merged:  # computed by the first of its siblings' kernel
            return
        if step.output in self.siblings:
            self.siblings_step(self.siblings[step.output], cand.seconds)
            return
        compute = self.part.task(step.key).compute
        if cand.config == TORCH:  # fallback="torch": torch's kernel on the device tensors
            ops = [self.operand(a) for a in step.args]
            out = GBuf(compute.output.numel, compute.output.shape)
            fn = Reference(compute)
            self._add(GpuStep(step.layer, TORCH, (step.layer,), ops, out, cand.seconds,
                              key=step.key, fn=fn), step.output)
            return
        cfg = cand.config
        at = self.build_key(step, cfg)
        kernel, binary = self._build(step, compute, *at[1:])
        rounded = at[-1]
        out_layout = cuda_layouts(compute, cfg)[1]
        inputs = [b for b in kernel.buffers if b.role == "in"]
        if len(step.args) != len(inputs):
            raise CompileError(f"{step.layer}: {len(step.args)} operands for the "
                               f"{len(inputs)} input buffers of task {step.key}'s kernel")
        ops = []
        for i, (arg, kb, lay) in enumerate(zip(step.args, inputs,
                                               operand_layouts(compute, cfg))):
            op = self.const(arg, lay, rounded=True) if rounded and i == 1 else \
                self.read_in_place.get(arg) or self.operand(arg, lay)
            size = self.consts[op.index].size if isinstance(op, Const) else op.size
            if size != kb.size:
                raise CompileError(f"{step.layer}: operand {arg} holds {size} floats, kernel "
                                   f"buffer {kb.name} of task {step.key} reads {kb.size}")
            ops.append(op)
        ops += self.scratch(kernel)
        value = self.in_place.written.get(step.output, step.output)
        out = GBuf(compute.output.numel, tuple(self.graph.shape_of(value)), out_layout)
        self._add(GpuStep(step.layer, "kernel", (step.layer,), ops, out, cand.seconds,
                          step.key, kernel, binary), value)

    def scratch(self, kernel: CudaKernel) -> list[Const]:
        """A constant for each scratch buffer of the kernel (split-K's partial sums and
        counters): zeroed once, left by the kernel as it found them."""
        out = []
        for kb in kernel.buffers:
            if kb.role == "scratch":
                self.consts.append(np.zeros(kb.size, np.float32))
                out.append(Const(len(self.consts) - 1))
        return out

    def siblings_step(self, siblings: "Siblings", seconds: float) -> None:
        """Sibling denses (one input, one task, one config) as one kernel: a batched
        matmul over the group (sibling_compute), its weights and biases stacked into one
        constant each, its output one buffer of which each dense's value is a part;
        `seconds`: one dense's record."""
        group, first = siblings.steps, siblings.steps[0]
        compute = sibling_compute(self.part.task(first.key).compute, len(group))
        at = self.build_key(first, siblings.config)
        kernel, binary = self._build(first, compute, *at[1:])
        ops = [self.value(first.args[0], NCHW)]
        for i in range(1, len(first.args)):  # the weights, then each bias
            key = (tuple(s.args[i] for s in group), at[-1] and i == 1)
            if key not in self.stacked:
                stack = np.concatenate([self.graph.params[a].detach().cpu().float().numpy()
                                        .ravel() for a in key[0]])
                self.consts.append(tf32(stack) if key[1] else stack)
                self.stacked[key] = Const(len(self.consts) - 1)
            ops.append(self.stacked[key])
        ins = [b for b in kernel.buffers if b.role == "in"]
        sizes = [self.consts[o.index].size if isinstance(o, Const) else o.size for o in ops]
        if sizes != [b.size for b in ins]:
            raise CompileError(f"{first.layer}: operands of {sizes} floats for the merged "
                               f"kernel's buffers of {[b.size for b in ins]}")
        ops += self.scratch(kernel)
        size = compute.output.numel // len(group)
        out = GBuf(compute.output.numel, tuple(compute.output.shape))
        parts = []
        for g, s in enumerate(group):
            self.aliases.append(GBuf(size, tuple(self.graph.shape_of(s.output)), alias=out,
                                     within=g * size))
            parts.append((s.output, self.aliases[-1]))
            self.produced[s.output] = (self.aliases[-1], NCHW)
        self.steps.append(GpuStep(" + ".join(s.layer for s in group), "kernel",
                                  tuple(s.layer for s in group), ops, out,
                                  seconds * len(group), first.key, kernel, binary,
                                  parts=tuple(parts)))

    def build_key(self, step: TaskStep, cfg: Config) -> tuple:
        """What a task step's kernel is rendered from: (task key, config, strides, how
        many sibling denses it computes, whether its weights are rounded to tf32 at
        packing). The config is the chosen one, or its siblings' (sibling_config)."""
        compute = self.part.task(step.key).compute
        if step.output in self.siblings:
            group = len(self.siblings[step.output].steps)
            merged = sibling_compute(compute, group)
            return (step.key, cfg, sibling_strides(compute), group,
                    self.rounding and rounds_weights(merged, cfg))
        rounded = self.rounding and rounds_weights(compute, cfg) and len(step.args) > 1 and \
            step.args[1] in self.graph.params
        return step.key, cfg, self.in_place.strides.get(step.output), 1, rounded

    def prebuild(self, todo: Iterable[tuple]) -> None:
        """Render and NVRTC-build the kernels of these build_key()s on concurrent threads
        (NVRTC runs outside Python's lock), ahead of `task`, which takes each build from
        here or reports what went wrong with it."""
        todo = list(dict.fromkeys(todo))
        if not todo:
            return
        workers = min(len(todo), PREBUILD_THREADS, os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for key, built in zip(todo, pool.map(lambda kc: self._render_build(*kc), todo)):
                self.prebuilt[key] = built

    def _render_build(self, key: str, cfg: Config, strides: Strides | None = None,
                      group: int = 1, rounded: bool = False):
        """(the kernel, or the exception rendering raised; the build, or None); `group`:
        the kernel of that many sibling denses of task `key` (sibling_compute)."""
        compute = self.part.task(key).compute
        try:
            kernel = render_cuda(compute if group == 1 else sibling_compute(compute, group),
                                 cfg, strides, rounded)
        except Exception as exc:
            return exc, None
        return kernel, compile_cuda(kernel.source, self.arch, f"{kernel.name}.cu")

    def _build(self, step: TaskStep, compute, cfg: Config, strides: Strides | None = None,
               group: int = 1, rounded: bool = False) -> tuple[CudaKernel, bytes]:
        """Render and NVRTC-build a build_key() once (`compute`: the task's, or the
        sibling_compute of `group` of its steps); a config that no longer renders or
        builds is an error naming the layer (records outlive code changes)."""
        at = (step.key, cfg, strides, group, rounded)
        if at in self.built:
            return self.built[at]
        where = f"layer {step.layer} (task {step.key}, {compute.describe()})"
        kernel, built = self.prebuilt.pop(at, None) or self._render_build(*at)
        if isinstance(kernel, Exception):
            raise CompileError(f"{where}: its best cuda config no longer renders: "
                               f"{kernel}") from None
        problems = [built.error] if built.error else resource_problems(built, kernel.threads)
        if problems:
            raise CompileError(f"{where}: its best cuda config does not build for "
                               f"{self.arch}: " + "; ".join(problems))
        self.built[at] = (kernel, built.cubin)
        return self.built[at]

    def glue(self, step: GlueStep) -> None:
        node = self.graph.node_map()[step.node]
        if node.name in self.in_place.read:  # its readers view its input in place
            self.read_in_place[node.name] = self.value(node.inputs[0], NCHW)
            return
        if node.name in self.in_place.written.values():  # its producer wrote it
            return
        shape = tuple(self.graph.shape_of(node.name))
        ops = [self.operand(v) for v in node.inputs]
        if node.op == "reshape" and isinstance(ops[0], GBuf):  # a view: no copy, no step
            self.aliases.append(GBuf(math.prod(shape), shape, alias=ops[0]))
            self.produced[node.name] = (self.aliases[-1], NCHW)
            return
        fn = Glue(node)
        kind = "torch" if node.op == "torch" else "glue"  # an island runs PyTorch's op
        self._add(GpuStep(node.name, kind, (node.layer,), ops,
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
    for b in list(aliases) + pinned:  # an alias after the buffer it views
        b.offset = (b.alias.offset if b.alias is not None else b.offset) + b.within
    return top


def plan_network(part: Partition, chosen: Sequence[Candidate | None], arch: str,
                 estimated_s: float = 0.0, layout_plan: LayoutPlan | None = None,
                 rewrites: bool = True) -> GpuPlan:
    """The plan of a partitioned graph from each step's chosen candidate (a config, or
    TORCH; None for glue steps); builds every kernel with NVRTC for `arch`. `rewrites`:
    sibling denses as one kernel, permutes read and written in place by matmuls, tf32
    weights rounded at packing; without them every step is its own launch or copy."""
    siblings = sibling_denses(part, chosen) if rewrites else {}
    in_place = permutes_in_place(part, chosen) if rewrites else None
    planner = Planner(part, arch, in_place, siblings, rewrites)
    planner.prebuild(
        planner.build_key(step, siblings[step.output].config if step.output in siblings
                          else cand.config)
        for step, cand in zip(part.steps, chosen)
        if isinstance(step, TaskStep) and isinstance(cand.config, Config) and
        step.output not in planner.merged)
    for step, cand in zip(part.steps, chosen):
        if isinstance(step, TaskStep):
            planner.task(step, cand)
        else:
            planner.glue(step)
    outputs = planner.outputs()
    arena = assign_offsets(planner.steps, planner.inputs + outputs, planner.aliases)
    return GpuPlan(arch, part, planner.steps, planner.inputs, outputs, planner.consts,
                   arena, planner.value_of, estimated_s, layout_plan)


def sibling_compute(dense: Compute, group: int) -> Compute:
    """`group` denses of one task on one input as one batched matmul: x [1, M, K] shared,
    the weights stacked [group, K, N] (each read as it lies, [N, K]: sibling_strides), the
    output [group, M, N]; a bias becomes an add of the biases stacked [group, 1, N], and
    every operand-free epilogue op stays."""
    k = dense.inputs[0].shape[-1]
    m, n = dense.output.numel // dense.output.shape[-1], dense.output.shape[-1]
    epilogue = []
    for op in dense.epilogue:
        if op.op == "bias":
            epilogue.append(EpilogueOp("add", (TensorSpec((group, 1, n)),)))
        elif op.operands:
            raise CompileError(f"no sibling kernel for a dense with a {op.op} operand")
        else:
            epilogue.append(op)
    return Compute("matmul", (TensorSpec((1, m, k)), TensorSpec((group, k, n))),
                   TensorSpec((group, m, n)), (), tuple(epilogue))


def sibling_strides(dense: Compute) -> Strides:
    """Where sibling_compute's operands lie: x as it is, each weight [N, K] (read along
    K), the output contiguous."""
    k, n = dense.inputs[0].shape[-1], dense.output.shape[-1]
    return (None, (n * k, 1, k), None)


def sibling_denses(part: Partition, chosen: Sequence[Candidate | None]
                   ) -> "dict[str, Siblings]":
    """Denses that read one input and are steps of one task run with one config (a
    transformer layer's query, key and value projections), grouped where the batched
    kernel of the group renders with that config (split-K lowered: sibling_config): the
    first one's value -> the group, its steps in step order. One launch of the group's
    blocks fills more of the GPU than each dense's grid alone, at batch 1 a few dozen to a
    few hundred blocks. Their weights and biases are parameters, their epilogue a bias or
    operand-free ops."""
    groups: dict[tuple, list[TaskStep]] = {}
    params = part.graph.params
    for step, cand in zip(part.steps, chosen):
        if not isinstance(step, TaskStep) or not isinstance(cand.config, Config):
            continue
        compute = part.task(step.key).compute
        if compute.op != "dense" or step.args[0] in params or \
                not all(a in params for a in step.args[1:]) or \
                any(op.operands and op.op != "bias" for op in compute.epilogue):
            continue
        groups.setdefault((step.key, cand.config, step.args[0]), []).append(step)
    out = {}
    for (key, cfg, _), steps in groups.items():
        if len(steps) < 2:
            continue
        dense = part.task(key).compute
        merged, strides = sibling_compute(dense, len(steps)), sibling_strides(dense)
        cfg = sibling_config(merged, cfg, strides)
        if strided_problem(merged, cfg, strides) is None:
            out[steps[0].output] = Siblings(tuple(steps), cfg)
    return out


def sibling_config(merged: Compute, cfg: Config, strides: Strides) -> Config:
    """The dense's config for the kernel of its siblings: the same, with its split-K
    factor lowered as far as the larger grid needs (a split past MAX_SPLIT_BLOCKS blocks
    has no point: the GPU is full several times over without it)."""
    split = cfg.get("split", 1)
    if split == 1:
        return cfg
    view = gemm_view(merged, "NCHW", strides)
    allowed = [f for f in split_k.splits(view, *block_tile(cfg), cfg["bk"]) if f <= split]
    return Config(tuple(sorted({**dict(cfg.knobs), "split": max(allowed)}.items())))


@dataclass(frozen=True)
class Siblings:
    """Sibling denses run as one kernel, with its config (sibling_config)."""

    steps: tuple[TaskStep, ...]
    config: Config


@dataclass(frozen=True)
class InPlace:
    """Permutes no step copies: `read` (permutes' values), whose readers, matmul kernels
    all, read the permute's input buffer in place;
    `written` (a matmul's value -> the permute of it), a matmul's output that only a
    permute reads, written in the permuted order; `strides` (a matmul step's value -> its
    A's, B's and output's strides, each None where contiguous) for rendering them."""

    read: frozenset[str]
    written: dict[str, str]
    strides: dict[str, Strides]


def permutes_in_place(part: Partition, chosen: Sequence[Candidate | None]) -> InPlace:
    """Where a permute (attention's head split, its transposed keys, its head merge) can
    be a matmul's strided read or write instead of a copy of its own: each reader a
    matmul kernel reading it as A or B, or the matmul that produced it read by it alone;
    and the kernel's config renders so (render.strided_problem: a config tuned for the
    contiguous matmul may need other tilings, such as keys read along the head width).
    Values of the graph's outputs are never strided."""
    graph = part.graph
    nodes = graph.node_map()
    chosen_of = {step.output: (step, cand) for step, cand in zip(part.steps, chosen)
                 if isinstance(step, TaskStep)}
    readers: dict[str, list] = {}
    for step in part.steps:
        args = step.args if isinstance(step, TaskStep) else nodes[step.node].inputs
        for pos, arg in enumerate(args):
            readers.setdefault(arg, []).append((step, pos))
    kept = set(graph.outputs) | set(graph.params) | {name for name, _ in graph.inputs}
    read: set[str] = set()
    written, strides = {}, {}

    def strided(uses: list[tuple[str, int]], st: tuple[int, ...]) -> dict | None:
        """The strides of every matmul step in `uses` (its value, the slot 0-2 that `st`
        fills: A, B, output) with `st` added, where each still renders; else None."""
        trial = {}
        for value, slot in uses:
            step, cand = chosen_of[value]
            compute = part.task(step.key).compute
            have = list(trial.get(value) or strides.get(value) or (None, None, None))
            if compute.op != "matmul" or not isinstance(cand.config, Config) or \
                    have[slot] is not None:
                return None
            have[slot] = st
            if strided_problem(compute, cand.config, tuple(have)) is not None:
                return None
            trial[value] = tuple(have)
        return trial

    for step in part.steps:
        node = nodes[step.node] if isinstance(step, GlueStep) else None
        if node is None or node.op != "permute" or node.name in kept or \
                node.inputs[0] in kept or node.inputs[0] in read:
            continue
        dims, src = tuple(node.attr("dims")), node.inputs[0]
        base = contiguous_strides(tuple(graph.shape_of(src)))
        users = readers.get(node.name, [])
        if users and all(isinstance(s, TaskStep) and pos < 2 and s.output in chosen_of
                         for s, pos in users):
            trial = strided([(s.output, pos) for s, pos in users],
                            tuple(base[d] for d in dims))
            if trial is not None:
                strides.update(trial)
                read.add(node.name)
                continue
        if src in chosen_of and [s for s, _ in readers.get(src, [])] == [step]:
            permuted = contiguous_strides(tuple(graph.shape_of(node.name)))
            out = [0] * len(dims)  # the matmul's axis dims[j] is the permuted value's j
            for j, d in enumerate(dims):
                out[d] = permuted[j]
            trial = strided([(src, 2)], tuple(out))
            if trial is not None:
                strides.update(trial)
                written[src] = node.name
    return InPlace(frozenset(read), written, strides)


def step_candidates(part: Partition, records: list[Record],
                    torch_s: dict[str, float] | None = None) -> list[list[Candidate]]:
    """Per step: the best record of each (input, output) layout pair of its task, as
    Candidates carrying their Config; with `torch_s` (fallback="torch"), torch's kernel
    too at its measured time, and no record slower than it. Glue steps read and write
    NCHW."""
    def layouts(task, cfg):  # a stale config is named when planned, if it is chosen
        return cuda_layouts(task.compute, cfg)
    tuned = {t.key: candidates_from_records(t, records, layouts) for t in part.tasks}
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
    of the same memory order cost nothing; each (shape, from, to) is timed once (a
    ResNet-18 plan asks 55 times for 11 of them)."""
    timed: dict[tuple, float] = {}

    def transform(shape, a, b):
        key = (tuple(shape), a, b)
        if same_order(key[0], a, b):
            return 0.0
        if key not in timed:
            timed[key] = transform_s(*key)
        return timed[key]
    plan, chosen = choose(part, cands, layout, transform, time_limit_s, solver)
    return plan, [c if isinstance(s, TaskStep) else None for s, c in zip(part.steps, chosen)]
