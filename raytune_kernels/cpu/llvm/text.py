"""LLVM IR written straight to text: the few instructions the renderer uses, spelled and
numbered exactly as llvmlite.ir spells and numbers them.

llvmlite.ir builds an object per instruction, per operand list and per name, and formats
each one through several layers of str.format: ~28 us an instruction, 60 ms for a
ResNet-18 convolution candidate, the largest part of a build's CPU time (render 65 ms of
~157 ms a trial). Here an instruction is one formatted line. The text is
byte-for-byte what llvmlite.ir produced for the same calls (tests/cpu/test_llvm_ir.py's
goldens), so builds, their cache keys and the kernels are unchanged.

Types are their IR spelling ("float", "<8 x float>", "ptr"); a value is its type and its
reference ("%\".12\"", "0x3ff0000000000000", "splat (float 0x0)").
"""
from __future__ import annotations

import functools
import re
from contextlib import contextmanager

import llvmlite.ir as _ir

I1, I32, I64, F32, PTR, VOID = "i1", "i32", "i64", "float", "ptr", "void"
_SIMPLE = re.compile(r"[-a-zA-Z$._][-a-zA-Z$._0-9]*")  # a label that needs no quotes


def vector(element: str, lanes: int) -> str:
    return f"<{lanes} x {element}>"


class Value:
    """An SSA value or a constant: its type and how an operand refers to it. `constant`:
    an integer constant's value (the loops read it to skip a guard)."""
    __slots__ = ("type", "ref", "constant")

    def __init__(self, type: str, ref: str, constant: int | None = None):
        self.type, self.ref, self.constant = type, ref, constant

    def operand(self) -> str:
        return f"{self.type} {self.ref}"


@functools.lru_cache(maxsize=4096)
def const(type: str, value) -> Value:
    """A scalar constant: integers as written, floats in llvmlite's hexadecimal spelling."""
    if type == F32:
        return Value(F32, _ir.Constant(_ir.FloatType(), float(value)).get_reference())
    return Value(type, str(int(value)), int(value))


def splat(element: str, lanes: int, value) -> Value:
    """Every lane `value`, in LLVM's short form (llvmlite spells a vector constant element
    by element, which made constants a third of an unrolled kernel's text)."""
    return Value(vector(element, lanes), f"splat ({element} {const(element, value).ref})")


def _quoted(name: str) -> str:
    return '"' + name.replace("\\", "\\5c").replace('"', '\\22') + '"'


class _Names:
    """A function's names, deduplicated as llvmlite's NameScope does: unnamed values take
    ".1", ".2", ... and a name taken before gets ".1", ".2", ... appended."""

    def __init__(self):
        self.used, self.counts = {""}, {}

    def take(self, name: str = "") -> str:
        base = name
        while name in self.used:
            n = self.counts.get(base, 0) + 1
            self.counts[base] = n
            name = f"{base}.{n}"
        self.used.add(name)
        return name


class Block:
    __slots__ = ("name", "lines", "terminated")

    def __init__(self, name: str):
        self.name, self.lines, self.terminated = name, [], False

    @property

    def ref(self) -> str:
        return "%" + _quoted(self.name)


class Phi(Value):
    """A phi whose incoming edges are added after it is emitted (a loop's back edge)."""
    __slots__ = ("incoming",)

    def __init__(self, type: str, ref: str):
        super().__init__(type, ref)
        self.incoming: list[tuple[Value, Block]] = []

    def add_incoming(self, value: Value, block: Block) -> None:
        self.incoming.append((value, block))

    def __str__(self) -> str:
        edges = ", ".join(f"[{v.ref}, {b.ref}]" for v, b in self.incoming)
        return f"{self.ref} = phi  {self.type} {edges}"


class Function(Value):
    """A defined function (with blocks) or a declaration."""
    __slots__ = ("name", "ret", "params", "args", "names", "blocks", "linkage")

    def __init__(self, module: Module, ret: str, params: list[str], name: str):
        super().__init__(f"{ret} ({', '.join(params)})*", "@" + _quoted(name))
        self.name, self.ret, self.params, self.linkage = name, ret, params, ""
        self.names = _Names()
        self.args = [Value(t, "%" + _quoted(self.names.take())) for t in params]
        self.names.take()  # llvmlite names the return value too
        self.blocks: list[Block] = []
        module.functions.append(self)

    def append_basic_block(self, name: str = "") -> Block:
        block = Block(self.names.take(name))
        self.blocks.append(block)
        return block

    def __str__(self) -> str:
        head = " ".join(x for x in ("define" if self.blocks else "declare", self.linkage,
                                    self.ret) if x)
        proto = f"{head} {self.ref}({', '.join(a.operand() for a in self.args)})\n"
        if not self.blocks:
            return proto
        out = [proto, "{\n"]
        for block in self.blocks:
            label = block.name if _simple(block.name) else _quoted(block.name)
            out.append(f"{label}:\n")
            out += [f"  {line}\n" for line in block.lines]
        out.append("}\n")
        return "".join(out)


def _simple(name: str) -> bool:
    return _SIMPLE.fullmatch(name) is not None


class Module:

    def __init__(self, name: str):
        self.name, self.functions = name, []

    def __str__(self) -> str:
        head = [f'; ModuleID = "{self.name}"', 'target triple = "unknown-unknown-unknown"',
                'target datalayout = ""', ""]
        return "\n".join(head + [str(f) for f in self.functions])


class Builder:
    """Appends instructions to a block of one function (llvmlite.ir.IRBuilder's calls,
    for the instructions the renderer emits)."""

    def __init__(self, fn: Function, block: Block):
        self.fn, self.block = fn, block

    # ---- positions ----

    def position_at_end(self, block: Block) -> None:
        self.block = block

    @contextmanager

    def goto_entry_block(self):
        """Emit into the entry block, before its branch when it has one (allocas)."""
        saved, self.block = self.block, self.fn.blocks[0]
        try:
            yield
        finally:
            self.block = saved

    # ---- emitting ----

    def _line(self, text: str) -> None:
        block = self.block
        if block.terminated:  # an alloca into the entry block: before its branch
            block.lines.insert(len(block.lines) - 1, text)
        else:
            block.lines.append(text)

    def _value(self, type: str, text: str, name: str = "") -> Value:
        ref = "%" + _quoted(self.fn.names.take(name))
        self._line(f"{ref} = {text}")
        return Value(type, ref)

    def _void(self, text: str) -> None:
        self.fn.names.take()
        self._line(text)

    def _terminate(self, text: str) -> None:
        self._void(text)
        self.block.terminated = True

    def alloca(self, type: str) -> Value:
        return self._value(PTR, f"alloca {type}")

    def load(self, ptr: Value, typ: str, align: int | None = None) -> Value:
        tail = f", align {align}" if align else ""
        return self._value(typ, f"load {typ}, {ptr.operand()}{tail}")

    def store(self, value: Value, ptr: Value, align: int | None = None) -> None:
        tail = f", align {align}" if align else ""
        self._void(f"store {value.operand()}, {ptr.operand()}{tail}")

    def gep(self, ptr: Value, indices: list[Value], inbounds: bool = False,
            source_etype: str = F32) -> Value:
        idx = ", ".join(i.operand() for i in indices)
        kw = "getelementptr inbounds" if inbounds else "getelementptr"
        return self._value(PTR, f"{kw} {source_etype}, {ptr.operand()}, {idx}")

    def call(self, fn: Function, args: list[Value]) -> Value | None:
        text = f"call {fn.ret} {fn.ref}({', '.join(a.operand() for a in args)})"
        if fn.ret == VOID:
            self._void(text)
            return None
        return self._value(fn.ret, text)

    def _binary(self, op: str, x: Value, y: Value, flags=()) -> Value:
        head = " ".join((op, *flags))
        return self._value(x.type, f"{head} {x.type} {x.ref}, {y.ref}")

    def fadd(self, x, y) -> Value:
        return self._binary("fadd", x, y)

    def fsub(self, x, y) -> Value:
        return self._binary("fsub", x, y)

    def fmul(self, x, y) -> Value:
        return self._binary("fmul", x, y)

    def fdiv(self, x, y) -> Value:
        return self._binary("fdiv", x, y)

    def sdiv(self, x, y) -> Value:
        return self._binary("sdiv", x, y)

    def udiv(self, x, y) -> Value:
        return self._binary("udiv", x, y)

    def urem(self, x, y) -> Value:
        return self._binary("urem", x, y)

    def shl(self, x, y) -> Value:
        return self._binary("shl", x, y)

    def add(self, x: Value, y: Value, flags=()) -> Value:
        return self._binary("add", x, y, flags)

    def sub(self, x: Value, y: Value, flags=()) -> Value:
        return self._binary("sub", x, y, flags)

    def mul(self, x: Value, y: Value, flags=()) -> Value:
        return self._binary("mul", x, y, flags)

    def fneg(self, x: Value) -> Value:
        return self._value(x.type, f"fneg {x.operand()}")

    def _cast(self, op: str, x: Value, to: str) -> Value:
        return self._value(to, f"{op} {x.operand()} to {to}")

    def sext(self, x, to) -> Value:
        return self._cast("sext", x, to)

    def fptosi(self, x, to) -> Value:
        return self._cast("fptosi", x, to)

    def bitcast(self, x, to) -> Value:
        return self._cast("bitcast", x, to)

    def fptrunc(self, x, to) -> Value:
        return self._cast("fptrunc", x, to)

    def _compare(self, op: str, cond: str, x: Value, y: Value) -> Value:
        lanes = x.type[1:].split(" x ")[0] if x.type.startswith("<") else None
        return self._value(vector(I1, int(lanes)) if lanes else I1,
                           f"{op} {cond} {x.type} {x.ref}, {y.ref}")

    def icmp_signed(self, cmp: str, x: Value, y: Value) -> Value:
        return self._compare("icmp", _SIGNED[cmp], x, y)

    def fcmp_ordered(self, cmp: str, x: Value, y: Value) -> Value:
        return self._compare("fcmp", _ORDERED[cmp], x, y)

    def fcmp_unordered(self, cmp: str, x: Value, y: Value) -> Value:
        return self._compare("fcmp", _UNORDERED[cmp], x, y)

    def select(self, cond: Value, x: Value, y: Value) -> Value:
        return self._value(x.type, f"select  {cond.operand()}, {x.operand()}, {y.operand()}")

    def insert_element(self, vec: Value, x: Value, idx: Value) -> Value:
        return self._value(vec.type, f"insertelement {vec.operand()}, {x.operand()}, "
                                     f"{idx.operand()}")

    def extract_element(self, vec: Value, idx: Value) -> Value:
        element = vec.type[1:-1].split(" x ", 1)[1]
        return self._value(element, f"extractelement {vec.operand()}, {idx.operand()}")

    def shuffle_vector(self, x: Value, y: Value, mask: Value, lanes: int = 0) -> Value:
        """x and y's lanes picked by `mask`: `lanes` of them (x's count by default)."""
        typ = x.type if not lanes else vector(x.type[1:-1].split(" x ", 1)[1], lanes)
        return self._value(typ, f"shufflevector {x.operand()}, {y.operand()}, "
                                f"{mask.operand()}")

    def phi(self, type: str, name: str = "") -> Phi:
        value = Phi(type, "%" + _quoted(self.fn.names.take(name)))
        self._line(value)
        return value

    def branch(self, target: Block) -> None:
        self._terminate(f"br label {target.ref}")

    def cbranch(self, cond: Value, then: Block, other: Block) -> None:
        self._terminate(f"br {cond.operand()}, label {then.ref}, label {other.ref}")

    def ret_void(self) -> None:
        self._terminate("ret void")


_SIGNED = {"<": "slt", "<=": "sle", ">": "sgt", ">=": "sge", "==": "eq", "!=": "ne"}
_ORDERED = {"<": "olt", "<=": "ole", ">": "ogt", ">=": "oge", "==": "oeq", "!=": "one"}
_UNORDERED = {"<": "ult", "<=": "ule", ">": "ugt", ">=": "uge", "==": "ueq", "!=": "une",
              "uno": "uno"}
