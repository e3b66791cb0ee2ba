"""The measuring contract (measure.py): results as data and the output check."""
import math

import pytest
import torch

from raytune_kernels.measure import (CRASHED, ERROR_KINDS, NON_FINITE, WRONG_OUTPUT,
                                     MeasureOptions, MeasureResult, check_output)

QUICK = MeasureOptions(threads=1, min_repeat_ms=2, repeats=3)


def test_output_checks_name_the_problem():
    ok = torch.ones(3)
    assert check_output(ok, ok, QUICK) is None
    assert check_output(ok * 2, ok, QUICK)[0] == WRONG_OUTPUT
    assert check_output(torch.ones(4), ok, QUICK) == (WRONG_OUTPUT, "shape (4,) != (3,)")
    assert check_output(torch.tensor([1.0, float("nan"), 1.0]), ok, QUICK) == \
        (NON_FINITE, "1 of 3 outputs are NaN or infinite")


def test_a_result_is_times_or_an_error_and_travels_as_json():
    timed = MeasureResult((2e-3, 1e-3, 3e-3), build_s=0.5, run_s=0.1,
                          phases=(("load", 0.01), ("check", 0.02), ("timing", 0.07)))
    assert timed.ok and timed.median == 2e-3
    failed = MeasureResult.error(CRASHED, "x" * 3000, build_s=0.5)
    assert not failed.ok and failed.median == math.inf and len(failed.error_msg) == 2000
    for r in (timed, failed):
        assert MeasureResult.from_json(r.to_json()) == r
    with pytest.raises(AssertionError):
        MeasureResult.error("slow", "not an error kind")
    assert CRASHED in ERROR_KINDS and len(set(ERROR_KINDS)) == len(ERROR_KINDS)


def test_the_oracle_is_computed_in_float64_and_rounded_to_float32():
    """GPT-2's GELU chain, as captured: the reference a candidate is checked against is the
    float64 computation rounded once, whatever torch's float32 functions would return."""
    from raytune_kernels.measure import exact_reference, operands_and_reference
    from raytune_kernels.task import Compute, EpilogueOp, TensorSpec

    spec = TensorSpec((1, 4, 3072))
    gelu = Compute("elementwise", (spec,), spec, (), (
        EpilogueOp("square"), EpilogueOp("mul", (spec,)), EpilogueOp("mul", scalar=0.044715),
        EpilogueOp("add", (spec,)), EpilogueOp("mul", scalar=0.7978845608028654),
        EpilogueOp("tanh"), EpilogueOp("add", scalar=1.0), EpilogueOp("mul", (spec,))))
    ops, expected = operands_and_reference(gelu, seed=3)
    x, a, b, c = (t.double() for t in ops)
    exact = (torch.tanh((x * x * a * 0.044715 + b) * 0.7978845608028654) + 1.0) * c
    assert expected.dtype == torch.float32
    assert torch.equal(expected, exact.float())  # rounded once, from float64
    assert torch.equal(exact_reference(gelu, ops), expected)
    # integer operands (token ids) are left as they are
    ids = Compute("elementwise", (TensorSpec((2, 3), "int64"),), TensorSpec((2, 3), "int64"))
    assert exact_reference(ids, [torch.arange(6).reshape(2, 3)]).dtype == torch.int64
