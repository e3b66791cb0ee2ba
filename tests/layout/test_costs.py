import math

import torch

import raytune_kernels as rk
from raytune_kernels.space import Config
from raytune_kernels.layout.costs import layouts_of, transform_seconds
from raytune_kernels.measure import MeasureOptions

QUICK = MeasureOptions(threads=1, min_repeat_ms=2, repeats=3)


def conv_task():
    model = torch.nn.Conv2d(32, 64, 3, padding=1)
    return rk.extract_tasks(model.eval(), (torch.randn(1, 32, 8, 8),))[0]


def direct(cb, ob, out="blocked"):
    return Config.of(lanes=16, ob=ob, tile_h=1, tile_w=8, cb=cb, out_layout=out,
                     spatial_order=("ko", "oh", "ow"), reduce_order=("co", "kh", "kw"),
                     parallel=1, unroll=False)


def test_layouts_follow_the_config():
    task = conv_task()
    assert layouts_of(task, direct(1, 32)) == ("NCHW/p1x1", "NCHW32c")
    assert layouts_of(task, direct(32, 16, "nhwc")) == ("NHWC/p1x1", "NHWC")
    assert layouts_of(task, direct(8, 64)) == ("NCHW8c/p1x1", "NCHW64c")


def test_transform_costs_are_measured_and_checked():
    shape = (1, 32, 14, 14)
    t = transform_seconds(shape, "NCHW", "NCHW16c", QUICK)
    assert 0 < t < 1e-2
    assert transform_seconds(shape, "NHWC", "NHWC", QUICK) == 0.0
    assert 0 < transform_seconds(shape, "NHWC", "NHWC/p1x1", QUICK) < 1e-2  # a border: a copy
    assert math.isinf(transform_seconds((1, 24, 4, 4), "NCHW", "NCHW16c", QUICK))


def test_layout_actor_solves_like_the_local_solver(ray_session):
    import random

    from actors.layout_actor import LayoutActor
    from raytune_kernels.layout.problem import solve_ilp
    from tests.layout.test_problem import random_problem
    problem = random_problem(random.Random(7), 12, False)
    actor = LayoutActor.remote()
    try:
        plan = ray_session.get(actor.solve.remote(problem, 10.0))
    finally:
        ray_session.kill(actor)  # it holds a CPU: later tests' measurers need the session's
    assert plan.cost == solve_ilp(problem).cost and plan.optimal
