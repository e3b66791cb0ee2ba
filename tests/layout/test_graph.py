"""layout_problem(): edges priced by transforms, and borders that producers write."""
import pytest
import torch

import raytune_kernels as rk
from raytune_kernels.frontend.partition import TaskStep, partition
from raytune_kernels.layout.graph import Candidate, layout_problem
from raytune_kernels.layout.problem import solve_brute

COPY = 5e-6  # every transform between two different labels


class Branches(torch.nn.Module):
    """x -> expand -> depthwise (one reader); expand2 -> two depthwise readers."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(8, 16, 1)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.expand2 = torch.nn.Conv2d(16, 16, 1)
        self.dw_a = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.dw_b = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x):
        y = self.expand2(self.dw(self.expand(x)))
        return self.dw_a(y) * self.dw_b(y)


def problem(bordering):
    part = partition(rk.capture(Branches().eval(), (torch.randn(1, 8, 6, 6),)))

    def candidates(step):
        if isinstance(step, TaskStep) and part.task(step.key).compute.attr("groups") > 1:
            return [Candidate("NHWC/p1x1", "NHWC", 1e-5)]
        return [Candidate("NHWC", "NHWC", 1e-5)]

    def transform(shape, a, b):
        return 0.0 if a == b else COPY
    return layout_problem(part, candidates, transform, bordering)[0]


def test_a_producer_that_writes_its_only_readers_border_prices_the_edge_at_nothing():
    plain, bordered = problem(None), problem(lambda step, cand: True)
    cost = lambda p: solve_brute(p).cost  # noqa: E731
    # edges into a depthwise conv: expand -> dw, expand2 -> dw_a, expand2 -> dw_b (and the
    # graph input into expand, NCHW -> NHWC, priced in both)
    assert cost(plain) - cost(bordered) == pytest.approx(COPY)  # only the one-reader edge
    assert problem(lambda step, cand: False).edge_cost == plain.edge_cost
