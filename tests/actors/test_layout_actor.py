"""compile_network solves its layout problem in the LayoutActor on a Ray session, and in
the caller's process without one; both give the same plan."""
import sys

import torch

import raytune_kernels as rk
from actors.layout_actor import ACTOR, solve_on_ray
from raytune_kernels.compile.api import compile_network as compile_here
from raytune_kernels.layout.problem import LayoutProblem, solve_brute
from tests.compile.test_cpu_network import Small, measured_records


def _small():
    torch.manual_seed(0)
    model, inputs = Small().eval(), (torch.randn(1, 3, 16, 16),)
    return model, inputs, measured_records(model, inputs, per_task=3)


def test_the_layout_actor_solves_what_the_brute_force_solves(ray_session):
    # two nodes, two candidates each, an edge whose cost prefers matching layouts
    # alone, node 0 prefers candidate 0 and node 1 candidate 1; the edge prefers a match
    problem = LayoutProblem(("a", "b"), ((1.0, 1.5), (2.0, 1.0)), ((0, 1),),
                            (((0.0, 5.0), (5.0, 0.0)),))
    plan = solve_on_ray(problem, 5.0)
    assert plan.choice == solve_brute(problem).choice and plan.solver == f"ilp {ACTOR}"
    assert plan.cost == solve_brute(problem).cost == 2.5


def test_compile_on_ray_uses_the_actor_and_matches_in_process(ray_session, monkeypatch):
    model, inputs, records = _small()
    on_ray = rk.compile_network(model, inputs, records)
    assert on_ray.plan.solver.endswith(ACTOR)
    here = compile_here(model, inputs, records)
    assert not here.plan.solver.endswith(ACTOR)
    assert on_ray.plan.choice == here.plan.choice
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(on_ray(x), model(x), atol=1e-4, rtol=1e-4)
    # the same public call with no Ray session in this process solves here
    monkeypatch.setitem(sys.modules, "ray", None)
    assert not rk.compile_network(model, inputs, records).plan.solver.endswith(ACTOR)
