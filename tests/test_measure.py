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
