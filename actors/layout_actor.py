"""The layout actor: solves a layout problem with PuLP/CBC under a time limit.

raytune_kernels.compile_network on a running Ray session solves its layout problems here
(actors.driver.layout_solver gives it `solve_on_ray` as the solver), so a
cluster's driver, which may be a laptop, neither needs CBC's CPU time nor its binary."""
from __future__ import annotations

import dataclasses

import ray

from raytune_kernels.layout.problem import LayoutPlan, LayoutProblem, solve_ilp

ACTOR = "in the layout actor"  # appended to the plan's solver name, so reports say where


@ray.remote(num_cpus=1)
class LayoutActor:
    def solve(self, problem: LayoutProblem, time_limit_s: float = 20.0) -> LayoutPlan:
        plan = solve_ilp(problem, time_limit_s)
        return dataclasses.replace(plan, solver=f"{plan.solver} {ACTOR}")


def solve_on_ray(problem: LayoutProblem, time_limit_s: float = 20.0) -> LayoutPlan:
    """Solve in a LayoutActor on the head node. It holds a CPU where one is free; where
    measurers hold them all it takes none rather than wait behind them (the caller is
    blocked on it either way)."""
    from actors.tuning_actors import ON_HEAD

    cpus = 1 if ray.available_resources().get("CPU", 0) >= 1 else 0
    actor = LayoutActor.options(num_cpus=cpus, **ON_HEAD).remote()
    try:
        return ray.get(actor.solve.remote(problem, time_limit_s))
    finally:
        ray.kill(actor)
