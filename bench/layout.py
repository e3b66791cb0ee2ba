"""Layout ILP solve times on whole networks (ResNet-50, MobileNetV2, DenseNet-121).

    python bench/layout.py [--time-limit 60]

Costs here are synthetic (no measured records are needed to time a solver): every conv
offers each (input, output) pair among NCHW, NHWC and NCHW{8,16,32}c that divides its
channels, at a seeded random cost around its FLOPs at 200 GFLOP/s; window ops keep their
layout; dense, matmul, softmax and layer norm read NCHW; a transform costs its bytes at
10 GB/s. The ILP is compared with the best uniform layout (every node in one layout).
Last line of stdout: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import random
import sys

from raytune_kernels import zoo
from raytune_kernels.frontend.capture import capture
from raytune_kernels.layout.problem import solve_ilp
from raytune_kernels.layout.graph import Candidate, layout_problem
from raytune_kernels.frontend.partition import TaskStep, partition

LAYOUTS = ("NCHW", "NHWC", "NCHW8c", "NCHW16c", "NCHW32c")


def block(layout: str) -> int:
    return int(layout[4:-1]) if layout.endswith("c") else 1


def fits(layout: str, channels: int) -> bool:
    return channels % block(layout) == 0


def make_candidates(part, rng: random.Random):
    def candidates(x) -> list[Candidate]:
        if not isinstance(x, TaskStep):  # a concat: any layout all its inputs divide
            chans = [part.graph.shape_of(v)[1] for v in x.inputs] + [x.shape[1]]
            return [Candidate(lay, lay, 0.0) for lay in LAYOUTS if all(fits(lay, c) for c in chans)]
        c = part.task(x.key).compute
        base = max(c.flops(), 1e4) / 200e9
        if c.op == "conv2d" and c.attr("groups") == 1:
            cin, cout = c.inputs[0].shape[1], c.output.shape[1]
            return [Candidate(a, b, base * rng.uniform(0.8, 1.6)) for a in LAYOUTS
                    for b in LAYOUTS if fits(a, cin) and fits(b, cout)]
        if c.op in ("conv2d", "max_pool2d", "avg_pool2d", "elementwise") and \
                len(c.output.shape) == 4:
            return [Candidate(a, a, base * rng.uniform(0.8, 1.6)) for a in LAYOUTS
                    if fits(a, c.output.shape[1])]
        return [Candidate("NCHW", "NCHW", base)]
    return candidates


def transform(shape, a: str, b: str) -> float:
    n = 1
    for s in shape:
        n *= s
    return 0.0 if a == b else 2 * 4 * n / 10e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--time-limit", type=float, default=60.0)
    args = p.parse_args()
    out = {}
    for name in ("resnet50", "mobilenet_v2", "densenet121"):
        model, inputs = zoo.load(name)
        part = partition(capture(model, inputs))
        problem, cands = layout_problem(part, make_candidates(part, random.Random(0)), transform)
        plan = solve_ilp(problem, args.time_limit)
        uniform = []
        for lay in LAYOUTS:
            choice = tuple(next((k for k, c in enumerate(cs) if c.in_layout == lay == c.out_layout),
                                None) for cs in cands)
            fixed = tuple(k if k is not None else 0 for k in choice)
            uniform.append(problem.cost(fixed))
        out[name] = {"nodes": len(problem.nodes), "edges": len(problem.edges),
                     "candidates": sum(len(c) for c in cands),
                     "solve_s": round(plan.seconds, 3), "optimal": plan.optimal,
                     "ilp_ms": round(plan.cost * 1e3, 4),
                     "best_uniform_ms": round(min(uniform) * 1e3, 4)}
        print(f"{name}: {out[name]}", file=sys.stderr, flush=True)
    print(json.dumps({"solve": out, "time_limit_s": args.time_limit, "costs": "synthetic"}))


if __name__ == "__main__":
    main()
