"""A tuned CPU network as a flat plan: buffers (Buf) in their layouts, native calls (Step)
with their ctypes arguments made once, the planner that builds the chosen kernels and packs
weights once, the measured price of a layout transform, and buffer reuse (allocate).

compile/cpu_network.py runs the plan; this module only makes it."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import torch

from raytune_kernels.compile.choose import TORCH
from raytune_kernels.compile.refine import split_axis
from raytune_kernels.compile.step_fns import (ConcatInto, EmbeddingInto, Glue, Narrow,
                                              Reference)
from raytune_kernels.cpu.build import LoadedKernel, aligned, build
from raytune_kernels.cpu.contraction import contraction
from raytune_kernels.cpu.llvm.ir import render
from raytune_kernels.cpu.lower import operand_kinds
from raytune_kernels.cpu.row_kernels import ROW_OPS
from raytune_kernels.cpu.schedules import (lower, nhwc_reader, pack, reads_bordered_input,
                                           reads_bordered_residual, writes_bordered)
from raytune_kernels.space import Config
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.transform import Layout, concat_nest, strided_nest
from raytune_kernels.errors import CompileError
from raytune_kernels.layout.costs import fastest_transform, priced_transform, transform_kernel
from raytune_kernels.layout.graph import NCHW, Candidate
from raytune_kernels.measure import MeasureOptions
from raytune_kernels.frontend.partition import GlueStep, Partition, TaskStep, run_glue


# ----------------------------------------------------------------------------- the plan

@dataclass(eq=False)
class Buf:
    """A planned buffer: a value in one layout (None: plain contiguous), or a constant."""

    size: int
    shape: tuple[int, ...]
    layout: Layout | None = None
    border: float = 0.0
    pinned: bool = False  # graph inputs and outputs: never handed to another value
    alias: "Buf | None" = None  # a view of another buffer's first `size` floats (a reshape)

    @property
    def root(self) -> "Buf":
        return self.alias.root if self.alias is not None else self

    @property
    def bordered(self) -> bool:
        return self.layout is not None and self.layout.pad != (0, 0)


@dataclass(eq=False)
class Step:
    """One call of the compiled network: a native kernel over buffers, or a torch function
    of plain views (glue, fallback nodes)."""

    name: str
    kind: str  # "kernel", "transform", "torch", "glue"
    layers: tuple[str, ...]
    reads: list
    writes: list
    estimate: float = 0.0  # seconds the plan expected (record, transform timing)
    key: str | None = None  # task key of a task step
    kernel: LoadedKernel | None = None
    operands: list = field(default_factory=list)  # Buf or constant np.ndarray, in order
    weights: int | None = None  # a conv's or dense's packed weights: their operand index
    fn: Callable | None = None  # torch steps: plain tensors in -> tensor out
    into: Callable | None = None  # or: into(out, *ins) writes the result into out itself


class Planner:
    """Turns chosen candidates into steps over buffers, adding transforms where a reader
    wants a value in another layout than its producer wrote."""

    def __init__(self, part: Partition, mcpu: str | None, opts: MeasureOptions,
                 borders: dict[str, tuple[str, float]] | None = None,
                 priced_at: float | None = None):
        """`priced_at`: the clock (GHz) at which transforms are priced by the model instead
        of timed (transform_choice), or None to time them."""
        self.part, self.graph, self.mcpu, self.opts = part, part.graph, mcpu, opts
        self.priced_at = priced_at
        self.borders = borders or {}  # value -> the bordered layout all its readers want
        self.steps: list[Step] = []
        self.produced: dict[str, tuple[Buf, str]] = {}
        self.copies: dict[tuple[str, str, float], Buf] = {}
        # value -> the loop its producer's threads split first (refine.split_axis)
        self.split_of: dict[str, str | None] = {}
        self.kernels: dict[tuple[str, Config], tuple[LoadedKernel, object]] = {}
        self.inputs: list[Buf] = []
        self.value_of: dict[int, tuple[str, str]] = {}  # step -> (value, layout) it completes
        self.aliases: list[Buf] = []
        for name, shape in self.graph.inputs:
            buf = Buf(math.prod(shape), tuple(shape), pinned=True)
            self.inputs.append(buf)
            self.produced[name] = (buf, NCHW)

    def value(self, name: str, label: str, border: float = 0.0, reader: str | None = None
              ) -> Buf:
        """`name` in layout `label`, transformed (and cached) when needed; `reader`: the
        loop the reading kernel's threads split first (split_axis), for copies_by_rows."""
        src_buf, src_label = self.produced[name]
        if label == src_label:
            return src_buf
        key = (name, label, border)
        if key in self.copies:
            return self.copies[key]
        shape = self.graph.shape_of(name)
        dst = Layout.parse(label)
        seconds, cfg = transform_choice(tuple(shape), src_label, label, self.opts,
                                        self.priced_at)
        via = via_layout(src_label, label)
        if cfg is None and via:  # blocks that do not divide: through their common block
            src_buf, src_label = self.value(name, via, reader=reader), via
            seconds, cfg = transform_choice(tuple(shape), via, label, self.opts,
                                            self.priced_at)
        if cfg is None:
            raise CompileError(f"no transform of {name} {tuple(shape)} from {src_label} to "
                               f"{label}")
        if cfg["parallel"]:
            rows = copies_by_rows(self.split_of.get(name), reader)
            cfg = Config(tuple(sorted(cfg.knobs + (("rows_first", rows),))))
        kernel = transform_kernel(tuple(shape), Layout.parse(src_label), dst, cfg)
        out = Buf(dst.size(shape), tuple(shape), dst, border)
        self.steps.append(Step(f"{name}: {src_label} -> {label}", "transform", (),
                               [src_buf], [out], seconds, kernel=kernel,
                               operands=[src_buf, out]))
        self.copies[key] = out
        return out

    def plain(self, name: str) -> Buf | torch.Tensor:
        if name in self.graph.params:
            return self.graph.params[name]
        return self.value(name, NCHW)

    def task(self, step: TaskStep, cand: Candidate) -> None:
        task = self.part.task(step.key)
        compute = task.compute
        if cand.config == TORCH:
            args = [self.plain(a) for a in step.args]
            out = Buf(compute.output.numel, compute.output.shape)
            fn = _torch_fn(compute)
            self._torch(step.layer, "torch", (step.layer,), args, out, fn, cand.seconds,
                        step.key)
            self._produce(step.output, out, NCHW)
            return
        cfg, out_label, out_border = cand.config, cand.out_layout, 0.0
        want = self.borders.get(step.output)
        if want and writes_bordered(compute, cfg) and \
                Layout.parse(want[0]).name == Layout.parse(cand.out_layout).name:
            # written straight into its readers' bordered buffer: no copy adds the border
            out_label, out_border = want
            cfg = Config(tuple(sorted(cfg.knobs + (("out_pad", Layout.parse(want[0]).pad),))))
        residuals = [step.args[i] for i in residual_positions(compute)
                     if step.args[i] not in self.graph.params]
        res_label = self._bordered_residual(residuals, compute, cfg, cand.out_layout)
        if res_label:  # read where its other reader wants it, bordered: no copy drops it
            cfg = Config(tuple(sorted(cfg.knobs + (("res_pad",
                                                     Layout.parse(res_label).pad),))))
        in_label = self._bordered_input(step.args[0], compute, cfg, cand.in_layout)
        if in_label != cand.in_layout:  # read inside its other reader's border: no copy
            cfg = Config(tuple(sorted(cfg.knobs + (("in_pad", Layout.parse(in_label).pad),))))
        kernel, nest = self._kernel(compute, cfg, step.key)
        split = split_axis(cfg)
        holders = [self.graph.params[a] if a in self.graph.params
                   else torch.zeros(self.graph.shape_of(a)) for a in step.args]
        packed = pack(compute, cfg, holders)
        names = operand_names(compute, cfg)
        n_in = len(compute.inputs)
        kinds = [k.kind for k in operand_kinds(compute)] if compute.op not in ROW_OPS else []
        bound: dict[str, Buf | np.ndarray] = {}
        reads = []
        for i, (arg, bname) in enumerate(zip(step.args, names)):
            if arg in self.graph.params:  # small pages now, merged into huge ones later:
                # a compile faults no huge page (cpu/build.py's aligned)
                bound[bname] = aligned(packed[bname], fault_small=True)
                continue
            if i == 0:
                border = -math.inf if compute.op == "max_pool2d" else 0.0
                buf = self.value(arg, in_label, border, reader=split)
            elif i < n_in or compute.op in ROW_OPS or kinds[i - n_in] == "channel":
                buf = self.value(arg, NCHW)
            else:  # a residual, in the output's layout (with the border it lives in)
                buf = self.value(arg, res_label or cand.out_layout, reader=split)
            if buf.size != packed[bname].size:
                raise CompileError(f"{step.layer}: operand {arg} holds {buf.size} floats in "
                                   f"{cand.in_layout if i == 0 else 'its layout'}, the kernel "
                                   f"reads {packed[bname].size}")
            bound[bname] = buf
            reads.append(buf)
        out_shape = compute.output.shape
        layout = None if out_label == NCHW else Layout.parse(out_label)
        bordered = layout is not None and layout.pad != (0, 0)
        internal = not bordered and packed["out"].size != compute.output.numel  # padded dense
        out = Buf(packed["out"].size, (packed["out"].size,) if internal else out_shape, layout,
                  out_border)
        bound["out"] = out
        # a workspace is a value of its own step, written and dead within it (module
        # docstring of allocate)
        scratch = {b.name: Buf(b.size, (b.size,)) for b in nest.buffers
                   if b.role == "scratch" and b.name not in bound}
        operands = [bound[b.name] if b.name in bound else scratch[b.name] if b.name in scratch
                    else aligned(packed[b.name], fault_small=True) for b in nest.buffers]
        weights = next((i for i, b in enumerate(nest.buffers) if b.name == "b"), None) \
            if compute.op in ("conv2d", "dense") else None
        self.steps.append(Step(step.layer, "kernel", (step.layer,), reads,
                               [out, *scratch.values()], cand.seconds, step.key, kernel,
                               operands=operands, weights=weights))
        if internal:  # dense with N padded to the vector block: keep the first N columns
            rows, n = compute.output.numel // out_shape[-1], out_shape[-1]
            if rows == 1:  # one row: its first N floats are the output, no copy
                self.aliases.append(Buf(compute.output.numel, out_shape, alias=out))
                self.produced[step.output] = (self.aliases[-1], NCHW)
                return
            final = Buf(compute.output.numel, out_shape)
            self._torch(f"{step.layer} (narrow)", "glue", (step.layer,), [out], final,
                        Narrow(rows, n, tuple(out_shape)), 0.0, None)
            out = final
        self._produce(step.output, out, NCHW if internal else out_label)
        self.split_of[step.output] = split

    def _bordered_input(self, value: str, compute, cfg: Config, label: str) -> str:
        """The bordered layout `value` already lives in where the step reads it in `label`
        unbordered and its kernel can read the interior of a border (reads_bordered_input);
        else `label` (read it as it is, or a copy)."""
        if value in self.graph.params or value not in self.produced or \
                not reads_bordered_input(compute, cfg):
            return label
        lay, want = Layout.parse(self.produced[value][1]), Layout.parse(label)
        return lay.label if lay.pad != (0, 0) and want.pad == (0, 0) and \
            lay.name == want.name else label

    def _bordered_residual(self, residuals: list[str], compute, cfg: Config,
                           label: str) -> str | None:
        """The bordered layout the residuals of a step that reads them in `label` already
        live in (its producer wrote its other reader's border), where the kernel can read
        them there (reads_bordered_residual) and they share it; None: read an unbordered
        copy."""
        lives = {self.produced[a][1] for a in residuals}
        if len(lives) != 1 or not reads_bordered_residual(compute, cfg):
            return None
        lay = Layout.parse(next(iter(lives)))
        return lay.label if lay.pad != (0, 0) and lay.name == label else None

    def glue(self, step: GlueStep) -> None:
        node = self.graph.node_map()[step.node]
        args = [self.plain(v) for v in node.inputs]
        shape = tuple(self.graph.shape_of(node.name))
        if node.op == "reshape" and isinstance(args[0], Buf):  # a view: no copy, no call
            self.aliases.append(Buf(math.prod(shape), shape, alias=args[0]))
            self.produced[node.name] = (self.aliases[-1], NCHW)
            return
        out = Buf(math.prod(shape), shape)
        # a native copy where it is one (a view's, or a concat of values): no PyTorch
        # between native kernels
        lanes = cpu_info(self.mcpu).lanes[0]
        view = _view_of(node, args)
        if view is not None:
            size = args[0].size
            kernel = self._copy(("strided", size, *view, lanes),
                                lambda: strided_nest(size, *view, lanes))
        elif node.op == "concat" and len(args) > 1 and \
                all(isinstance(a, Buf) and a.size for a in args):
            shapes = [tuple(self.graph.shape_of(v)) for v in node.inputs]
            dim = node.attr("dim")
            kernel = self._copy(("concat", tuple(shapes), dim, lanes),
                                lambda: concat_nest(shapes, dim, lanes))
        else:
            kernel = None
        if kernel is not None:
            self.steps.append(Step(node.name, "glue", (node.layer,), list(args), [out],
                                   kernel=kernel, operands=[*args, out]))
            self._produce(node.name, out, NCHW)
            return
        kind = "torch" if node.op == "torch" else "glue"  # an island runs PyTorch's op
        self._torch(node.name, kind, (node.layer,), args, out, Glue(node), 0.0, None)
        if node.op == "concat":  # written in place: no temporary, no second copy
            self.steps[-1].into = ConcatInto(node.attr("dim"))
        elif node.op == "embedding" and getattr(args[1], "dtype", torch.float32) == \
                torch.float32:  # a table of parameters, or of a float32 buffer
            self.steps[-1].into = EmbeddingInto()
        self._produce(node.name, out, NCHW)

    def _produce(self, value: str, buf: Buf, label: str) -> None:
        self.produced[value] = (buf, label)
        self.value_of[id(self.steps[-1])] = (value, label)

    def outputs(self) -> list[Buf]:
        outs = [self.value(v, NCHW) for v in self.graph.outputs]
        for b in outs:
            b.pinned = True
        return outs

    def _torch(self, name, kind, layers, args, out, fn, seconds, key) -> None:
        reads = [a for a in args if isinstance(a, Buf)]
        self.steps.append(Step(name, kind, layers, reads, [out], seconds, key,
                               operands=list(args), fn=fn))

    def _copy(self, key: tuple, make: Callable) -> LoadedKernel:
        """The native copy kernel `key` names, from its nest (`make()`), built once per
        compile."""
        if key not in self.kernels:
            nest = make()
            built = build(render(nest), self.mcpu, persist=True)
            if built.error:
                raise CompileError(f"the copy {key} does not build: {built.error}")
            self.kernels[key] = (LoadedKernel(built.library, nest.name, len(nest.buffers)),
                                 nest)
        return self.kernels[key][0]

    def _kernel(self, compute, cfg: Config, key: str):
        if (key, cfg) not in self.kernels:
            nest = lower(compute, cfg)
            built = build(render(nest), self.mcpu, persist=True)  # the next compile loads it
            if built.error:
                raise CompileError(f"task {key} ({compute.describe()}): its best config no "
                                   f"longer builds: {built.error}")
            self.kernels[(key, cfg)] = (LoadedKernel(built.library, nest.name,
                                                     len(nest.buffers)), nest)
        return self.kernels[(key, cfg)]


VIEW_OPS = ("permute", "index", "expand")  # glue whose result may be a view of its input


def _view_of(node, args: list) -> tuple[tuple, tuple, int] | None:
    """(shape, strides, offset in floats) of the glue node's result where it is a view of
    its one computed input (a permute, a basic index or slice, an expand), found by running
    the node on a meta tensor of the input's shape; None for any other node (advanced
    indexing copies, and stays PyTorch's)."""
    if node.op not in VIEW_OPS or len(args) != 1 or not isinstance(args[0], Buf) or \
            not args[0].size:
        return None
    src = torch.empty(args[0].shape, device="meta")
    try:
        v = run_glue(node, {node.inputs[0]: src})
    except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError):
        return None  # an index meta tensors cannot take: PyTorch's, as before
    if v._base is not src or v.dim() == 0 or not v.numel():
        return None
    return tuple(v.shape), tuple(v.stride()), v.storage_offset()


def borders_wanted(part: Partition, chosen: list[Candidate]) -> dict[str, tuple[str, float]]:
    """Values that every reader reads in one and the same bordered layout (a windowed
    kernel's input with its padding as a border), or reads as a residual in that layout
    unbordered with a kernel that can read it bordered, and that are no graph output:
    value -> (that layout, its border value). Their producer may write into that buffer
    directly (Planner.task) instead of a transform copying them into it, and the
    residual's readers read its interior (res_pad), as do readers of the value as an input
    in that layout unbordered whose kernel can read inside a border (in_pad: a direct
    conv of no padding, reads_bordered_input)."""
    reads: dict[str, set] = {}
    nodes = part.graph.node_map()
    for step, cand in zip(part.steps, chosen):
        if isinstance(step, GlueStep):
            for v in nodes[step.node].inputs:
                reads.setdefault(v, set()).add(None)
            continue
        compute = part.task(step.key).compute
        op = compute.op
        residual = set(residual_positions(compute)) if cand.config not in (None, TORCH) and \
            reads_bordered_residual(compute, cand.config) else set()
        for i, arg in enumerate(step.args):
            if arg in part.graph.params:
                continue
            bordered = i == 0 and cand.config != TORCH and \
                Layout.parse(cand.in_layout).pad != (0, 0)
            border = -math.inf if op == "max_pool2d" else 0.0
            if bordered:
                read = (cand.in_layout, border)
            elif i in residual:  # read from any border of its layout
                read = (RESIDUAL, cand.out_layout)
            elif i == 0 and cand.config not in (None, TORCH) and \
                    reads_bordered_input(compute, cand.config):
                read = (RESIDUAL, Layout.parse(cand.in_layout).name)
            else:
                read = None
            reads.setdefault(arg, set()).add(read)
    for v in part.graph.outputs:
        reads.setdefault(v, set()).add(None)
    out = {}
    for v, r in reads.items():
        strict = [x for x in r if x is None or x[0] != RESIDUAL]
        if len(strict) == 1 and strict[0] is not None and \
                all(Layout.parse(strict[0][0]).name == x[1] for x in r if x not in strict):
            out[v] = strict[0]
    return out


# borders_wanted: a read, of a residual or of a 1x1 conv's input, that its kernel can make
# inside any border of its layout (res_pad, in_pad)
RESIDUAL = "residual"


def residual_positions(compute) -> list[int]:
    """The positions, among a task step's arguments, of its residuals: epilogue operands
    laid out like the output."""
    if compute.op in ROW_OPS:
        return []
    n_in = len(compute.inputs)
    return [n_in + j for j, k in enumerate(operand_kinds(compute)) if k.kind == "output"]


def via_layout(src: str, dst: str) -> str | None:
    """The layout a transform between two channel blocks neither of which divides the
    other goes through: their common block (NCHW48c -> NCHW16c -> NCHW32c)."""
    a, b = Layout.parse(src).block, Layout.parse(dst).block
    if not a or not b or a % b == 0 or b % a == 0:
        return None
    g = math.gcd(a, b)
    return "NCHW" if g == 1 else f"NCHW{g}c"


def transforms_asked(ask: Callable[[Callable[[tuple, str, str], float]], object]
                     ) -> list[tuple[tuple[int, ...], str, str]]:
    """Every (shape, src, dst) transform that transform_cost will time when `ask(cost)`
    builds its layout problems with `cost`, collected without timing any: those then go
    to measure_transforms together (built in parallel, timed in one child)."""
    asked: list[tuple[tuple[int, ...], str, str]] = []

    def note(shape, src: str, dst: str) -> float:
        asked.append((tuple(shape), src, dst))
        via = via_layout(src, dst)
        if via:  # timed through it when there is no direct transform
            asked.extend([(tuple(shape), src, via), (tuple(shape), via, dst)])
        return 0.0
    ask(note)
    return list(dict.fromkeys(asked))


def nhwc_reads(part: Partition, chosen: list[Candidate]) -> list[Candidate]:
    """The plan with values kept NHWC where a copy would bring them into channel blocks:
    every direct conv that reads blocks (NCHW[cb]c, or NCHW) of a value its producer
    writes NHWC reads that value as it is, a block at a time (schedules.nhwc_reader; the
    kernel otherwise the same); and first, a conv that writes blocks (NCHW[ob]c) none of
    whose readers reads them as they are, and each of which can read NHWC, writes NHWC
    (its knob out_layout; not one with a residual, which it reads in its output's layout).
    Each turned kernel is priced as its record timed the original; compile_network weighs
    the plan against `chosen` as both run (refine.weigh_plans)."""
    graph, nodes = part.graph, part.graph.node_map()
    out = list(chosen)
    readers: dict[str, list[tuple[int, int]]] = {}  # value -> (step, argument position)
    for i, step in enumerate(part.steps):
        args = step.args if isinstance(step, TaskStep) else nodes[step.node].inputs
        for j, arg in enumerate(args):
            if arg not in graph.params:
                readers.setdefault(arg, []).append((i, j if isinstance(step, TaskStep) else -1))

    def compute(i: int):
        return part.task(part.steps[i].key).compute

    def as_read(i: int, j: int) -> str | None:
        """The layout step i reads its argument j in (None: plain, or not ours)."""
        cand = out[i]
        if j < 0 or cand.config in (None, TORCH):
            return None
        if j == 0:
            return cand.in_layout
        return cand.out_layout if j in residual_positions(compute(i)) else None

    def reads_nhwc(i: int, j: int) -> bool:
        read = as_read(i, j)
        if read is not None and Layout.parse(read).name == "NHWC":
            return True
        return j == 0 and read is not None and \
            nhwc_reader(compute(i), out[i].config) is not None

    for i, (step, cand) in enumerate(zip(part.steps, chosen)):
        if not isinstance(step, TaskStep) or cand.config in (None, TORCH) or \
                step.output in graph.outputs or compute(i).op != "conv2d" or \
                cand.config.get("out_layout") != "blocked" or residual_positions(compute(i)):
            continue
        if not hasattr(contraction(compute(i)), "reads_nhwc"):  # a window's one layout knob
            continue
        taken = readers.get(step.output, [])
        written = Layout.parse(cand.out_layout).name
        if taken and all(reads_nhwc(r, j) and Layout.parse(as_read(r, j)).name != written
                         for r, j in taken):
            knobs = dict(cand.config.knobs)
            knobs["out_layout"] = "nhwc"
            out[i] = dataclasses.replace(cand, out_layout="NHWC",
                                         config=Config(tuple(sorted(knobs.items()))))
    written = {step.output: cand.out_layout for step, cand in zip(part.steps, out)
               if isinstance(step, TaskStep)}
    for i, (step, cand) in enumerate(zip(part.steps, out)):
        if not isinstance(step, TaskStep) or cand.config in (None, TORCH):
            continue
        src = written.get(step.args[0])
        if src is None or Layout.parse(src).name != "NHWC":
            continue
        twin = nhwc_reader(compute(i), cand.config)
        if twin is not None:
            pad = Layout.parse(cand.in_layout).pad
            out[i] = dataclasses.replace(cand, in_layout=Layout("NHWC", pad).label,
                                         config=twin)
    return out


def copies_by_rows(producer: str | None, reader: str | None) -> bool:
    """Whether a parallel transform's threads take bands of rows (cpu/transform.py's
    rows_first) rather than channel blocks, given the loops the value's producer and
    its reader split first (refine.split_axis; None where not a kernel or unknown): by
    channel blocks where more of the two split channel blocks (ko) than rows (oh), so
    that each thread copies what its core wrote or will read; by rows otherwise, whose
    shares are contiguous in channel-last layouts too (a thread's channel blocks of NHWC
    interleave with the other's in every pixel)."""
    sides = (producer, reader)
    return sides.count("ko") <= sides.count("oh")


def transform_cost(shape, src: str, dst: str, opts: MeasureOptions,
                   priced_at: float | None = None) -> float:
    """Seconds to bring a value from `src` to `dst` (measured, or priced at `priced_at`
    GHz: transform_choice), through their common block when there is no direct
    transform."""
    seconds = transform_choice(tuple(shape), src, dst, opts, priced_at)[0]
    via = via_layout(src, dst)
    if math.isinf(seconds) and via:
        seconds = (transform_choice(tuple(shape), src, via, opts, priced_at)[0]
                   + transform_choice(tuple(shape), via, dst, opts, priced_at)[0])
    return seconds


def transform_choice(shape: tuple[int, ...], src: str, dst: str, opts: MeasureOptions,
                     priced_at: float | None = None) -> tuple[float, Config | None]:
    """(seconds, config) of the transform src -> dst: the fastest timed one
    (layout/costs.fastest_transform), or with `priced_at` (GHz) the model's price where
    no timing is at hand (layout/costs.priced_transform), which times nothing."""
    if priced_at is None:
        return fastest_transform(shape, src, dst, opts)
    return priced_transform(shape, src, dst, priced_at, opts)


def operand_names(compute, cfg: Config) -> list[str]:
    """The kernel buffer each reference operand is packed into, in operand order."""
    n_epi = sum(len(e.operands) for e in compute.epilogue)
    if compute.op in ROW_OPS:
        head = ["x"] + (["w", "b"] if compute.op == "layer_norm" else [])
    else:
        head = ["a"] + (["b"] if contraction(compute).has_b else [])
    return head + [f"e{i}" for i in range(n_epi)]


def _torch_fn(compute) -> Callable:
    return Reference(compute)


# ------------------------------------------------------------------------ buffer planning

ALIGN_FLOATS = 16  # arena offsets are multiples of a 64-byte cache line


def allocate(steps: list[Step], pinned: Iterable[Buf], aliases: Iterable[Buf] = ()
             ) -> tuple[dict[int, np.ndarray], list[tuple[Buf, int]]]:
    """An aligned array per buffer, and the bordered buffers whose border must be written
    again before their writer runs (cpu/border.py), each with how far into its memory
    other values write (_refills).

    Every value but the graph's inputs and outputs lives in one arena, at an offset, from
    the step that first writes it to its (or its views') last reader; two values whose
    lives overlap never share memory (largest first, each at the lowest offset free for
    its whole life, on a cache line). A dead value's memory serves later values of any
    kind and size, in part where they are smaller, so the arena is small and what a step
    writes was more often just used by an earlier step of the same run: against whole
    arrays handed from value to value (best fit), the arena of MobileNetV2 went from 14.0
    to 8.6 MiB and the network ran 1.05x faster end to end, ResNet-50 18.2 to 12.6 MiB and
    1.02x, ResNet-18 13.9 to 10.6 MiB and 1.00x (2 threads, interleaved). A bordered
    buffer keeps the border it was made with when nothing else is ever placed over its
    memory (or only buffers of its geometry at its offset); otherwise its border is
    written again on every run.

    A kernel's workspaces (Winograd's transformed tiles, im2col's columns) are values its
    step writes and no other reads, so they take arena memory like any other value: one
    workspace array kept for the whole network ran ResNet-18 1.04x and ResNet-50 1.02x
    slower end to end (2 threads, interleaved)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    roots: dict[int, Buf] = {}
    for i, s in enumerate(steps):
        for b in s.writes:
            first.setdefault(id(b.root), i)
            roots[id(b.root)] = b.root
        for b in s.reads + s.writes:
            last[id(b.root)] = i
    keep = {id(b.root) for b in pinned}
    arrays: dict[int, np.ndarray] = {}
    for b in pinned:
        if b.alias is None:
            arrays[id(b)] = aligned(np.zeros(b.size, np.float32), fault_small=True)
    for k in first:  # a value the graph returns, written by a step: memory of its own
        if k in keep and k not in arrays:
            b = roots[k]
            arrays[k] = aligned(np.full(b.size, b.border if b.bordered else 0.0, np.float32),
                                fault_small=True)
    values = [roots[k] for k in first if k not in keep]
    order = {id(b): n for n, b in enumerate(values)}
    offsets: dict[int, int] = {}
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first step, last step)
    for b in sorted(values, key=lambda b: (-b.size, order[id(b)])):
        life = first[id(b)], last[id(b)]
        busy = sorted((o, e) for o, e, f, l in placed if f <= life[1] and life[0] <= l)
        offset = 0
        for o, e in busy:
            if o - offset >= b.size:
                break
            offset = max(offset, -(-e // ALIGN_FLOATS) * ALIGN_FLOATS)
        offsets[id(b)] = offset
        placed.append((offset, offset + b.size, *life))
    total = max((e for _, e, _, _ in placed), default=0)
    arena = aligned(np.zeros(max(total, 1), np.float32), fault_small=True)
    for b in values:
        arrays[id(b)] = arena[offsets[id(b)]: offsets[id(b)] + b.size]
    refill = _refills(values, offsets)
    lost = {id(b) for b, _ in refill}
    for b in values:  # a border nothing else overwrites: written once, here
        if b.bordered and id(b) not in lost:
            arrays[id(b)][:] = b.border
    for b in list(aliases) + list(pinned):
        arrays[id(b)] = arrays[id(b.root)]
    return arrays, refill


def _refills(values: list[Buf], offsets: dict[int, int]) -> list[tuple[Buf, int]]:
    """(bordered buffer, floats of its memory within which other values write): every
    value placed over part of its memory, at another offset or of another geometry,
    whatever their lives (each run writes them all)."""
    out = []
    for b in values:
        if not b.bordered:
            continue
        start = offsets[id(b)]
        end = start + b.size
        reach = 0
        for x in values:
            o = offsets[id(x)]
            if x is b or o >= end or o + x.size <= start:
                continue
            if o == start and _geometry(x) == _geometry(b):
                continue
            reach = max(reach, min(b.size, o + x.size - start))
        if reach:
            out.append((b, reach))
    return out


def _geometry(b: Buf) -> tuple:
    """What a buffer's memory holds outside the values written into it: plain buffers
    nothing, bordered ones their border (where it lies, and its value)."""
    return (b.layout.label, b.shape, b.border) if b.bordered else None
