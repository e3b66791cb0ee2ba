"""Rendering of row statements (Reduce, Let, Map, MapGroup) and their vector expressions."""
from __future__ import annotations

from raytune_kernels.cpu.llvm.math_ops import UNARY, vexp
from raytune_kernels.cpu.llvm.text import F32, I32, I64, const
from raytune_kernels.cpu.loopnest import (Bin, Ld, LdScalar, Let, Map, MapGroup, Num, Reduce,
                                          Reg, Un)


def emit(em, s) -> None:
    if isinstance(s, Let):
        em.regs[s.reg] = _scalar(em, s.expr)
    elif isinstance(s, Reduce):
        _reduce(em, s)
    elif isinstance(s, Map):
        with em.loop(const(I64, 0), const(I64, s.extent), s.var) as iv:
            em.env[s.var] = iv
            value = vector(em, s.expr)
            if s.scalar:
                value = em.b.extract_element(value, const(I32, 0))
            em.b.store(value, em.pointer(s.out), align=4)
        if s.tail:  # the row's last, partial vector: its lanes past the row untouched
            em.env[s.var] = const(I64, s.extent)
            em.live = s.tail
            em.vstore(vector(em, s.expr), em.pointer(s.out), mask=s.tail)
            em.live = 0
    elif isinstance(s, MapGroup):
        with em.loop(const(I64, 0), const(I64, s.extent), s.var) as iv:
            em.env[s.var] = iv
            seen: dict = {}  # subexpression -> its value in this iteration
            for out, e in s.outs:
                em.b.store(vector(em, e, seen), em.pointer(out), align=4)
        if s.tail:  # as Map's
            em.env[s.var] = const(I64, s.extent)
            em.live, seen = s.tail, {}
            for out, e in s.outs:
                em.vstore(vector(em, e, seen), em.pointer(out), mask=s.tail)
            em.live = 0
    else:
        raise TypeError(f"cannot render {type(s).__name__}")


def _reduce(em, s: Reduce) -> None:
    b, start = em.b, -float("inf") if s.op == "max" else 0.0
    accs = [em.alloca(em.mod.vt) for _ in range(s.accs)]
    for a in accs:
        b.store(em.const(start), a)
    with em.loop(const(I64, 0), const(I64, s.extent // s.accs), s.var + "_o") as iv:
        for k, acc in enumerate(accs):
            j = b.add(b.mul(iv, const(I64, s.accs)), const(I64, k))
            em.env[s.var] = j
            x, old = vector(em, s.expr), b.load(acc, typ=em.mod.vt)
            b.store(_combine(em, s.op, old, x), acc)
    if s.tail:  # the row's last, partial vector: its dead lanes count as the identity
        em.env[s.var] = const(I64, s.extent)
        em.live = s.tail
        x = b.select(em.lane_mask(s.tail), vector(em, s.expr), em.const(start))
        em.live = 0
        b.store(_combine(em, s.op, b.load(accs[0], typ=em.mod.vt), x), accs[0])
    total = b.load(accs[0], typ=em.mod.vt)
    for acc in accs[1:]:
        total = _combine(em, s.op, total, b.load(acc, typ=em.mod.vt))
    lanes = [b.extract_element(total, const(I32, i))
             for i in range(em.mod.nest.lanes)]
    result = lanes[0]
    for x in lanes[1:]:
        result = _scalar_combine(em, s.op, result, x)
    em.regs[s.reg] = result


def _combine(em, op: str, x, y):
    return em.intrinsic("maxnum", x, y) if op == "max" else em.b.fadd(x, y)


def _scalar_combine(em, op: str, x, y):
    if op == "max":
        fn = em.mod.decl("llvm.maxnum.f32", F32, [F32, F32])
        return em.b.call(fn, [x, y])
    return em.b.fadd(x, y)


_BIN = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}


def vector(em, e, seen: dict | None = None):
    """Emit `e` as a <lanes x float> value; with `seen`, a subexpression already emitted
    into it is reused (a MapGroup's iteration)."""
    if seen is not None:
        if e not in seen:
            seen[e] = _vector(em, e, seen)
        return seen[e]
    return _vector(em, e, None)


def _vector(em, e, seen: dict | None):
    if isinstance(e, Ld):  # in a tail step, its live lanes only
        return em.vload(em.pointer(e.access), mask=em.live)
    if isinstance(e, (LdScalar, Reg, Num)):
        return em.splat(_scalar(em, e))
    if isinstance(e, Bin):
        x, y = vector(em, e.x, seen), vector(em, e.y, seen)
        if e.op in ("max", "min"):
            return em.intrinsic(e.op + "num", x, y)
        return getattr(em.b, _BIN[e.op])(x, y)
    x = vector(em, e.x, seen)
    if e.op == "exp":
        return vexp(em, x)
    if e.op == "sqrt":
        return em.intrinsic("sqrt", x)
    return UNARY[e.op](em, x)


def _scalar(em, e):
    """Emit a scalar float expression (registers, numbers, scalar loads)."""
    if isinstance(e, Reg):
        return em.regs[e.name]
    if isinstance(e, Num):
        return const(F32, float(e.value))
    if isinstance(e, LdScalar):
        return em.b.load(em.pointer(e.access), typ=F32, align=4)
    if isinstance(e, Bin):
        x, y = _scalar(em, e.x), _scalar(em, e.y)
        if e.op == "max":
            return em.b.call(em.mod.decl("llvm.maxnum.f32", F32, [F32, F32]), [x, y])
        return getattr(em.b, _BIN[e.op])(x, y)
    if isinstance(e, Un) and e.op == "sqrt":
        return em.b.call(em.mod.decl("llvm.sqrt.f32", F32, [F32]), [_scalar(em, e.x)])
    raise TypeError(f"not a scalar expression: {e}")
