import math

import numpy as np
import torch

import raytune_kernels as rk
from raytune_kernels.space import Config
from raytune_kernels.cpu.transform import Layout
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
    # a block of all 64 output channels is NHWC: no transform between the two is planned
    assert layouts_of(task, direct(8, 64)) == ("NCHW8c/p1x1", "NHWC")
    assert layouts_of(task, direct(32, 32)) == ("NHWC/p1x1", "NCHW32c")
    dw = rk.extract_tasks(torch.nn.Conv2d(32, 32, 3, padding=1, groups=32).eval(),
                          (torch.randn(1, 32, 8, 8),))[0]

    def window(ob):
        return Config.of(lanes=16, ob=ob, tile_h=1, tile_w=8, out_layout="blocked",
                         spatial_order=("ko", "oh", "ow"), reduce_order=("kh", "kw"),
                         parallel=1, unroll=False)
    assert layouts_of(dw, window(32)) == ("NHWC/p1x1", "NHWC")
    assert layouts_of(dw, window(16)) == ("NCHW16c/p1x1", "NCHW16c")


def test_a_block_of_every_channel_is_the_memory_of_nhwc():
    x = torch.randn(1, 64, 5, 7)
    for pad in ((0, 0), (1, 1)):
        nhwc, blocked = Layout("NHWC", pad), Layout("NCHW64c", pad)
        assert np.array_equal(nhwc.pack(x, -1.0), blocked.pack(x, -1.0))
        assert nhwc.size(x.shape) == blocked.size(x.shape)


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
