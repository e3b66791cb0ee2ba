"""Vector constants in LLVM's short forms, for the renderer and its math."""
from __future__ import annotations

import llvmlite.ir as ir


class Spelled(ir.Constant):
    """A vector constant written in one of LLVM's short forms (`poison`, `zeroinitializer`,
    `splat (float 0x...)`): llvmlite spells vector constants element by element, which
    made them a third of an unrolled kernel's IR text. `elements` keeps what llvmlite's
    checks read (a shuffle mask's values)."""

    def __init__(self, typ, text: str, elements=ir.Undefined):
        super().__init__(typ, elements)
        self.text = text

    def _get_reference(self):
        return self.text


def splat(typ: ir.VectorType, value) -> Spelled:
    """Every lane `value` (a float or an int, after the vector's element type)."""
    scalar = ir.Constant(typ.element, value).get_reference()
    return Spelled(typ, f"splat ({typ.element} {scalar})", [value] * typ.count)
