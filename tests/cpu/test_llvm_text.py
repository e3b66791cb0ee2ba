"""The IR text writer: names, allocas and phis as llvmlite.ir wrote them (the goldens in
test_llvm_ir.py hold whole kernels), and text that LLVM builds and runs."""
import numpy as np

from raytune_kernels.cpu.build import LoadedKernel, aligned, build
from raytune_kernels.cpu.llvm.text import (F32, I64, PTR, VOID, Builder, Function, Module,
                                           Value, const, splat, vector)


def test_names_are_numbered_and_deduplicated_as_llvmlite_does():
    fn = Function(Module("m"), VOID, [PTR, PTR], "f")
    assert [a.ref for a in fn.args] == ['%".1"', '%".2"']
    assert [fn.append_basic_block(n).name for n in ("entry", "i.body", "i.body", "i")] == \
        ["entry", "i.body", "i.body.1", "i"]
    b = Builder(fn, fn.blocks[0])
    x = b.load(fn.args[0], F32)
    b.store(x, fn.args[1])  # unnamed: a store takes a number too
    y = b.load(fn.args[0], F32)
    assert (x.ref, y.ref) == ('%".4"', '%".6"')  # .3 is the return value's
    assert b.phi(I64, name="i").ref == '%"i.1"'


def test_an_alloca_goes_before_the_entry_blocks_branch():
    fn = Function(Module("m"), VOID, [], "f")
    entry, body = fn.append_basic_block("entry"), fn.append_basic_block("body")
    b = Builder(fn, entry)
    b.branch(body)
    b.position_at_end(body)
    with b.goto_entry_block():
        slot = b.alloca(vector(F32, 4))
    b.ret_void()
    assert entry.lines == [f"{slot.ref} = alloca <4 x float>", 'br label %"body"']
    assert body.lines == ["ret void"]


def test_a_counted_loop_builds_and_runs():
    """out[i] = a[i] * 2 + 1 for i < 5, with a phi whose back edge is added after it,
    built and loaded as every kernel is (signature: buffers..., int32 threads)."""
    m = Module("loop")
    fn = Function(m, VOID, [PTR, PTR, "i32"], "scale")
    a, out, _ = fn.args
    entry, body, done = (fn.append_basic_block(x) for x in ("entry", "i.body", "i.done"))
    b = Builder(fn, entry)
    b.branch(body)
    b.position_at_end(body)
    i = b.phi(I64, name="i")
    i.add_incoming(const(I64, 0), entry)
    x = b.load(b.gep(a, [i], inbounds=True), F32, align=4)
    v = b.insert_element(Value(vector(F32, 1), "poison"), x, const("i32", 0))
    y = b.fadd(b.fmul(v, splat(F32, 1, 2.0)), splat(F32, 1, 1.0))
    b.store(b.extract_element(y, const("i32", 0)), b.gep(out, [i], inbounds=True), align=4)
    nxt = b.add(i, const(I64, 1), flags=["nsw", "nuw"])
    i.add_incoming(nxt, body)
    b.cbranch(b.icmp_signed("<", nxt, const(I64, 5)), body, done)
    b.position_at_end(done)
    b.ret_void()

    built = build(str(m))
    assert built.error is None, built.error
    src, dst = aligned(np.arange(5, dtype=np.float32)), aligned(np.zeros(5, np.float32))
    LoadedKernel(built.library, "scale", 2)([src.ctypes.data, dst.ctypes.data], 1)
    np.testing.assert_array_equal(dst, np.arange(5, dtype=np.float32) * 2 + 1)
