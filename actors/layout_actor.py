"""The layout actor: solves a layout problem with PuLP/CBC under a time limit."""
from __future__ import annotations

import ray

from raytune_kernels.layout.problem import LayoutPlan, LayoutProblem, solve_ilp


@ray.remote(num_cpus=1)
class LayoutActor:
    def solve(self, problem: LayoutProblem, time_limit_s: float = 20.0) -> LayoutPlan:
        return solve_ilp(problem, time_limit_s)
