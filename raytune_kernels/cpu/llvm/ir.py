"""Render a LoopNest to LLVM IR text (a pure function of the nest; text.py writes it).

Explicit <lanes x float> vectors and llvm.fma; accumulator tiles live in entry-block
allocas that SROA promotes to registers; the epilogue runs on the accumulators before the
store. A top-level parallel loop is outlined into a body function run by OpenMP's
GOMP_parallel, each thread taking a contiguous static share of the iterations.
The kernel's C signature: void name(float *buffers..., int32 nthreads).
"""
from __future__ import annotations

from contextlib import contextmanager

from raytune_kernels.cpu.llvm import row_statements
from raytune_kernels.cpu.llvm.text import (F32, I1, I32, I64, PTR, VOID, Builder, Function, Module,
                                           Value, const, splat, vector)
from raytune_kernels.cpu.llvm.math_ops import apply as apply_epilogue
from raytune_kernels.cpu.loopnest import (ADD, AMX_ROWS, BCAST_FMA, MAX, PARALLEL, UNROLL,
                                          VEC_FMA, Access, AmxGemm, EpiStep, For, LoopNest,
                                          Split, StoreTile, UpdateTile, ZeroTile)

LINE_FLOATS = 16  # floats in a 64-byte cache line


def i64(v: int) -> Value:
    return const(I64, v)


def render(nest: LoopNest) -> str:
    """LLVM IR text of `nest` (no target triple: the builder sets it)."""
    return str(_Module(nest).module)


class _Module:
    def __init__(self, nest: LoopNest):
        self.nest, self.module = nest, Module(nest.name)
        self.vt = vector(F32, nest.lanes)
        self._decls: dict[str, Function] = {}
        self.undef = Value(self.vt, "poison")
        self.splat_mask = Value(vector(I32, nest.lanes), "zeroinitializer")
        self.lane0 = const(I32, 0)
        self._consts: dict[str, Value] = {}
        self._build_entry()

    def decl(self, name: str, ret: str, args: list[str]) -> Function:
        if name not in self._decls:
            self._decls[name] = Function(self.module, ret, args, name)
        return self._decls[name]

    def _build_entry(self) -> None:
        n = len(self.nest.buffers)
        fn = Function(self.module, VOID, [PTR] * n + [I32], self.nest.name)
        em = _Emitter(self, fn, dict(zip((b.name for b in self.nest.buffers), fn.args)))
        for i, stmt in enumerate(self.nest.body):
            if isinstance(stmt, For) and stmt.kind == PARALLEL:
                self._parallel(em, stmt, i, fn.args[-1])
            else:
                em.stmt(stmt)
        em.b.ret_void()

    def _parallel(self, em: "_Emitter", loop: For, i: int, nthreads) -> None:
        names = [b.name for b in self.nest.buffers]
        st = f"[{len(names)} x {PTR}]"
        body = Function(self.module, VOID, [PTR], f"{self.nest.name}_par{i}")
        body.linkage = "internal"
        data = em.alloca(st)
        for k, name in enumerate(names):
            em.b.store(em.ptrs[name], em.b.gep(data, [const(I32, 0), const(I32, k)],
                                               inbounds=True, source_etype=st))
        gomp = self.decl("GOMP_parallel", VOID, [PTR, PTR, I32, I32])
        em.b.call(gomp, [body, data, nthreads, const(I32, 0)])
        inner = _Emitter(self, body, {})
        for k, name in enumerate(names):
            slot = inner.b.gep(body.args[0], [const(I32, 0), const(I32, k)],
                               inbounds=True, source_etype=st)
            inner.ptrs[name] = inner.b.load(slot, typ=PTR)
        inner.static_share(loop)
        inner.b.ret_void()


class _Emitter:
    """Emits statements into one function, with its own accumulator allocas."""

    def __init__(self, mod: _Module, fn: Function, ptrs: dict):
        self.mod, self.fn, self.ptrs = mod, fn, ptrs
        self.entry = fn.append_basic_block("entry")
        self.b = Builder(fn, self.entry)
        self.env: dict[str, object] = {}
        self.regs: dict[str, object] = {}  # scalar registers of row statements
        self.live = 0  # in a row statement's tail step: the lanes its loads read
        # (buffer, loop terms) -> pointer, valid in the loop body that computed it (loop())
        self.bases: dict[tuple, object] = {}
        self.accs = {t.name: [[self.alloca(mod.vt) for _ in range(t.vecs)] for _ in range(t.rows)]
                     for t in mod.nest.tiles}

    def alloca(self, ty: str) -> Value:
        with self.b.goto_entry_block():
            return self.b.alloca(ty)

    # ---- control flow ----
    @contextmanager
    def loop(self, start, stop, name: str):
        """A counted loop [start, stop) with an i64 phi; guarded when the trip count may be 0."""
        pre, body = self.b.block, self.fn.append_basic_block(f"{name}.body")
        done = self.fn.append_basic_block(f"{name}.done")
        if start.constant is not None and stop.constant is not None \
                and start.constant < stop.constant:
            self.b.branch(body)  # runs at least once: no guard to fold away
        else:
            self.b.cbranch(self.b.icmp_signed("<", start, stop), body, done)
        self.b.position_at_end(body)
        iv = self.b.phi(I64, name=name)
        iv.add_incoming(start, pre)
        outer = dict(self.bases)
        yield iv
        self.bases = outer  # what the body computed does not dominate what follows it
        nxt = self.b.add(iv, i64(1), flags=["nsw", "nuw"])
        iv.add_incoming(nxt, self.b.block)
        self.b.cbranch(self.b.icmp_signed("<", nxt, stop), body, done)
        self.b.position_at_end(done)

    def static_share(self, loop: For) -> None:
        tnum = self.mod.decl("omp_get_thread_num", I32, [])
        tcnt = self.mod.decl("omp_get_num_threads", I32, [])
        tid, nt = self.b.sext(self.b.call(tnum, []), I64), self.b.sext(self.b.call(tcnt, []), I64)
        lo = self.b.sdiv(self.b.mul(tid, i64(loop.extent)), nt)
        hi = self.b.sdiv(self.b.mul(self.b.add(tid, i64(1)), i64(loop.extent)), nt)
        with self.loop(lo, hi, loop.var) as iv:
            self.env[loop.var] = iv
            self.stmts(loop.body)

    def stmts(self, body) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s) -> None:
        if isinstance(s, For):
            self._for(s)
        elif isinstance(s, Split):
            self._split(s)
        elif isinstance(s, ZeroTile):
            init = self.const(s.value)
            for row in self.accs[s.tile]:
                for a in row:
                    self.b.store(init, a)
        elif isinstance(s, UpdateTile):
            self._update(s)
        elif isinstance(s, StoreTile):
            self._store(s)
        elif isinstance(s, AmxGemm):
            self._amx_gemm(s)
        else:
            row_statements.emit(self, s)

    def _for(self, s: For) -> None:
        if s.kind == UNROLL:
            for i in range(s.extent):
                self.env[s.var] = i
                self.stmts(s.body)
            return
        with self.loop(i64(0), i64(s.extent), s.var) as iv:
            self.env[s.var] = iv
            self.stmts(s.body)

    def _split(self, s: Split) -> None:
        rest = self.env[s.var]
        for name, extent in reversed(list(zip(s.names, s.extents))):
            if isinstance(rest, int):
                self.env[name], rest = rest % extent, rest // extent
            else:
                self.env[name] = self.b.urem(rest, i64(extent))
                rest = self.b.udiv(rest, i64(extent))

    # ---- data ----
    def pointer(self, acc: Access):
        """The address of `acc`'s element: a pointer to the part of its index that varies
        (shared by every access with the same loop terms in scope: the unrolled updates of
        a tile differ only in constants) plus the constant part, as an offset."""
        const, terms = acc.index.const, []
        for var, coef in acc.index.terms:
            x = self.env[var]
            if isinstance(x, int):
                const += coef * x
            else:
                terms.append((var, coef, x))
        base = self.ptrs[acc.buffer]
        if terms:
            key = (acc.buffer,) + tuple((var, coef, id(x)) for var, coef, x in terms)
            if key not in self.bases:
                value = None
                for _, coef, x in terms:
                    term = self.b.mul(x, i64(coef), flags=["nsw"]) if coef != 1 else x
                    value = term if value is None else self.b.add(value, term, flags=["nsw"])
                self.bases[key] = self.b.gep(base, [value], inbounds=True, source_etype=F32)
            base = self.bases[key]
        return self.at(base, const)

    def at(self, ptr, extra: int):
        """`extra` elements past `ptr`: a constant offset the instruction selector folds
        into the load's or store's address (no add per element for it to fold first)."""
        if not extra:
            return ptr
        return self.b.gep(ptr, [i64(extra)], inbounds=True, source_etype=F32)

    def vload(self, ptr, extra: int = 0, mask: int = 0):
        """The vector `extra` floats past `ptr`; with `mask`, its first `mask` lanes only
        (the rest read as 0, their memory untouched)."""
        if not mask:
            return self.b.load(self.at(ptr, extra), typ=self.mod.vt, align=4)
        m, lanes = self.mod, self.mod.nest.lanes
        fn = m.decl(f"llvm.masked.load.v{lanes}f32.p0", m.vt,
                    [PTR, I32, vector(I1, lanes), m.vt])
        return self.b.call(fn, [self.at(ptr, extra), const(I32, 4), self.lane_mask(mask),
                                Value(m.vt, "zeroinitializer")])

    def vstore(self, x, ptr, extra: int = 0, mask: int = 0) -> None:
        """Store vector `x` `extra` floats past `ptr`; with `mask`, its first lanes only."""
        if not mask:
            self.b.store(x, self.at(ptr, extra), align=4)
            return
        m, lanes = self.mod, self.mod.nest.lanes
        fn = m.decl(f"llvm.masked.store.v{lanes}f32.p0", VOID,
                    [m.vt, PTR, I32, vector(I1, lanes)])
        self.b.call(fn, [x, self.at(ptr, extra), const(I32, 4), self.lane_mask(mask)])

    def prefetch(self, ptr, ahead: int, span: int) -> None:
        """Ask for the cache lines of the `span` floats at `ptr`, `ahead` floats on. The
        address may lie past the buffer (no inbounds: a prefetch never faults)."""
        fn = self.mod.decl("llvm.prefetch.p0", VOID, [PTR, I32, I32, I32])
        read, keep, data = const(I32, 0), const(I32, 3), const(I32, 1)
        for off in range(0, span, LINE_FLOATS):
            at = self.b.gep(ptr, [i64(ahead + off)], inbounds=False, source_etype=F32)
            self.b.call(fn, [at, read, keep, data])

    def lane_mask(self, live: int) -> Value:
        lanes = self.mod.nest.lanes
        bits = ", ".join(f"i1 {'true' if i < live else 'false'}" for i in range(lanes))
        return Value(vector(I1, lanes), f"<{bits}>")

    def splat(self, x):
        m = self.mod
        v = self.b.insert_element(m.undef, x, m.lane0)
        return self.b.shuffle_vector(v, m.undef, m.splat_mask)

    def _update(self, s: UpdateTile) -> None:
        tile, lanes = self.mod.nest.tile(s.tile), self.mod.nest.lanes
        pa = self.pointer(s.a)
        bs = []
        if s.b is not None:
            pb = self.pointer(s.b)
            bs = [self.vload(pb, v * lanes, _mask(tile, v)) for v in range(tile.vecs)]
            if s.prefetch:
                self.prefetch(pb, s.prefetch, tile.vecs * lanes)
        for row, off in zip(self.accs[s.tile], tile.offsets(s.a_strides)):
            x = None
            if s.mode == BCAST_FMA:
                x = self.splat(self.b.load(self.at(pa, off), typ=F32, align=4))
            for v, acc in enumerate(row):
                a = x if x is not None else self.vload(pa, off + v * lanes, _mask(tile, v))
                self.b.store(self._combine(s.mode, acc, a, bs[v] if bs else None), acc)

    def _combine(self, mode: str, acc, a, b):
        if mode in (BCAST_FMA, VEC_FMA):
            return self.intrinsic("fma", a, b, self.b.load(acc, typ=self.mod.vt))
        if mode == MAX:
            return self.intrinsic("maxnum", self.b.load(acc, typ=self.mod.vt), a)
        if mode == ADD:
            return self.b.fadd(self.b.load(acc, typ=self.mod.vt), a)
        return a

    def _store(self, s: StoreTile) -> None:
        tile, lanes = self.mod.nest.tile(s.tile), self.mod.nest.lanes
        po = self.pointer(s.out)
        bases = [[self.pointer(a) for a, _ in step.operands] for step in s.epilogue]
        # a per-channel operand (strides (0, 0)) is the same vector for every row: loaded
        # once, not reloaded after each row's store (which, for all LLVM knows, aliases it)
        shared: dict[tuple[int, int, int], object] = {}

        def operand(k: int, j: int, st, r: int, v: int):
            if st != (0, 0):
                return self.vload(bases[k][j], _row_offset(tile, st, r) + v * lanes,
                                  _mask(tile, v))
            if (k, j, v) not in shared:
                shared[k, j, v] = self.vload(bases[k][j], v * lanes, _mask(tile, v))
            return shared[k, j, v]

        if s.pairs:
            self._store_pairs(s, po)
            return
        for r, (row, off) in enumerate(zip(self.accs[s.tile], tile.offsets(s.out_strides))):
            for v, acc in enumerate(row):
                x = self.b.load(acc, typ=self.mod.vt)
                for k, step in enumerate(s.epilogue):
                    ops = [operand(k, j, st, r, v) for j, (_, st) in enumerate(step.operands)]
                    x = self.epilogue(step, x, ops)
                if s.bf16:  # slots of two bf16 values (loopnest.StoreTile)
                    half = self.b.fptrunc(x, vector("bfloat", lanes))
                    self.b.store(half, self.at(po, off + v * lanes // 2), align=2)
                else:
                    self.vstore(x, po, off + v * lanes, _mask(tile, v))

    def _store_pairs(self, s: StoreTile, po) -> None:
        """Rows 2r and 2r+1 interleaved lane by lane, rounded to bf16 (loopnest.StoreTile
        with pairs)."""
        tile, lanes = self.mod.nest.tile(s.tile), self.mod.nest.lanes
        order = [x for j in range(lanes) for x in (j, lanes + j)]
        mask = Value(vector(I32, 2 * lanes), "<" + ", ".join(f"i32 {j}" for j in order) + ">")
        rows, offsets = self.accs[s.tile], tile.offsets(s.out_strides)
        for r in range(0, len(rows), 2):
            for v, low in enumerate(rows[r]):
                high = self.b.load(rows[r + 1][v], typ=self.mod.vt) if r + 1 < len(rows) \
                    else self.const(0.0)  # an odd last row pairs with zeros
                x = self.b.shuffle_vector(self.b.load(low, typ=self.mod.vt), high, mask,
                                          lanes=2 * lanes)
                half = self.b.fptrunc(x, vector("bfloat", 2 * lanes))
                self.b.store(half, self.at(po, offsets[r] + v * lanes), align=2)

    def _amx_gemm(self, s: AmxGemm) -> None:
        """The tiles' dot-product loops, one per tap, accumulators carried in x86_amx
        phis; LLVM's AMX passes configure the tile registers (ldtilecfg) from the shapes
        given here."""
        amx, i16, b = "x86_amx", "i16", self.b
        m = self.mod
        load = m.decl("llvm.x86.tileloadd64.internal", amx, [i16, i16, PTR, I64])
        dot = m.decl("llvm.x86.tdpbf16ps.internal", amx, [i16, i16, i16, amx, amx, amx])
        store = m.decl("llvm.x86.tilestored64.internal", VOID, [i16, i16, PTR, I64, amx])
        zero = m.decl("llvm.x86.tilezero.internal", amx, [i16, i16])
        full, width = const(i16, AMX_ROWS), const(i16, 64)
        rows = [const(i16, m) for m in s.rows]
        pa, pb, pc = self.pointer(s.a), self.pointer(s.b), self.pointer(s.c)
        tiles = [(i, j) for i in range(s.mt) for j in range(s.nt)]
        accs = {(i, j): b.call(load, [rows[i], width, self.at(pc, (i * s.nt + j) * 256),
                                      i64(64)]) if s.accumulate
                else b.call(zero, [rows[i], width]) for i, j in tiles}
        for t, tap in enumerate(s.taps):  # one loop over the steps of each tap
            pre = b.block
            body = self.fn.append_basic_block("amx.body")
            done = self.fn.append_basic_block("amx.done")
            b.branch(body)
            b.position_at_end(body)
            k = b.phi(I64, name="ks")
            k.add_incoming(i64(0), pre)
            phis = {}
            for tl in tiles:
                phis[tl] = b.phi(amx)
                phis[tl].add_incoming(accs[tl], pre)
            a_at = b.add(b.mul(k, i64(16), flags=["nsw"]), i64(tap))
            b_at = b.mul(b.add(k, i64(t * s.steps)), i64(256), flags=["nsw"])
            a_tiles = [b.call(load, [rows[i], width,
                                     b.gep(pa, [b.add(a_at, i64(i * s.a_tile))], inbounds=True,
                                           source_etype=F32), i64(4 * s.a_row)])
                       for i in range(s.mt)]
            b_tiles = [b.call(load, [full, width,
                                     b.gep(pb, [b.add(b_at, i64(j * s.b_tile))], inbounds=True,
                                           source_etype=F32), i64(64)])
                       for j in range(s.nt)]
            accs = {(i, j): b.call(dot, [rows[i], width, width, phis[i, j], a_tiles[i],
                                         b_tiles[j]]) for i, j in tiles}
            nxt = b.add(k, i64(1), flags=["nsw", "nuw"])
            k.add_incoming(nxt, b.block)
            for tl in tiles:
                phis[tl].add_incoming(accs[tl], b.block)
            b.cbranch(b.icmp_signed("<", nxt, i64(s.steps)), body, done)
            b.position_at_end(done)
        new = accs
        for i, j in tiles:
            b.call(store, [rows[i], width, self.at(pc, (i * s.nt + j) * 256), i64(64),
                           new[i, j]])

    # ---- epilogue math ----
    def const(self, value: float):
        key = repr(float(value))  # not the float: 0.0 == -0.0, and they differ here
        consts = self.mod._consts
        if key not in consts:
            consts[key] = splat(F32, self.mod.nest.lanes, float(value))
        return consts[key]

    def intrinsic(self, name: str, *args):
        lanes = self.mod.nest.lanes
        fn = self.mod.decl(f"llvm.{name}.v{lanes}f32", self.mod.vt, [self.mod.vt] * len(args))
        return self.b.call(fn, list(args))

    def epilogue(self, step: EpiStep, x, ops):
        return apply_epilogue(self, step, x, ops)


def _mask(tile, v: int) -> int:
    """The live lanes of vector `v` of the tile's rows, 0 where all are."""
    return tile.mask if v == tile.vecs - 1 else 0


def _row_offset(tile, strides: tuple[int, int], r: int) -> int:
    return tile.offsets(strides)[r]
