"""Layout selection: one candidate per node, minimising node costs plus edge costs.

A node's candidates are its kernels in different layouts (their measured times); an edge's
cost matrix holds the time of the transform between the producer's output layout and what
the consumer reads (0 where they match). Three solvers over the same problem:
- solve_ilp: binary x[node, candidate], exactly one per node; per edge, continuous pair
  variables y[a, b] whose marginals equal the two nodes' choices (exact, and tight on
  trees); PuLP + CBC with a time limit, after which the incumbent is used and the gap
  against the LP-relaxation bound is stated in a warning;
- solve_dp: dynamic programming for chain-shaped graphs (the graph tuner's method);
- solve_brute: enumeration, for tiny graphs (tests).
"""
from __future__ import annotations

import itertools
import math
import time
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class LayoutProblem:
    """Edge matrices are indexed by labels: what of a candidate the edge depends on (its
    output layout on the producer side, the layout it reads on the consumer side). Many
    candidates share a label, so the ILP needs pair variables over labels only. Without
    label maps, a candidate is its own label."""

    nodes: tuple[str, ...]
    node_cost: tuple[tuple[float, ...], ...]  # [node][candidate]
    edges: tuple[tuple[int, int], ...]  # (producer, consumer) node indices
    edge_cost: tuple[tuple[tuple[float, ...], ...], ...]  # [edge][src label][dst label]
    src_label: tuple[tuple[int, ...], ...] | None = None  # [edge][producer candidate]
    dst_label: tuple[tuple[int, ...], ...] | None = None  # [edge][consumer candidate]

    def labels(self, e: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        p, q = self.edges[e]
        src = self.src_label[e] if self.src_label else tuple(range(len(self.node_cost[p])))
        dst = self.dst_label[e] if self.dst_label else tuple(range(len(self.node_cost[q])))
        return src, dst

    def edge(self, e: int, a: int, b: int) -> float:
        """Cost of edge e when its producer takes candidate a and its consumer candidate b."""
        src, dst = self.labels(e)
        return self.edge_cost[e][src[a]][dst[b]]

    def cost(self, choice: tuple[int, ...]) -> float:
        total = sum(c[i] for c, i in zip(self.node_cost, choice))
        return total + sum(self.edge(e, choice[p], choice[q])
                           for e, (p, q) in enumerate(self.edges))


@dataclass(frozen=True)
class LayoutPlan:
    choice: tuple[int, ...]
    cost: float
    solver: str
    optimal: bool
    seconds: float
    gap: float = 0.0


def solve_brute(problem: LayoutProblem, limit: int = 2_000_000) -> LayoutPlan:
    start = time.perf_counter()
    sizes = [len(c) for c in problem.node_cost]
    if math.prod(sizes) > limit:
        raise ValueError(f"brute force over {math.prod(sizes)} combinations (limit {limit})")
    best = min(itertools.product(*(range(n) for n in sizes)), key=problem.cost)
    return LayoutPlan(tuple(best), problem.cost(best), "brute", True, time.perf_counter() - start)


def solve_dp(problem: LayoutProblem) -> LayoutPlan:
    """Exact for chains: edges (0,1), (1,2), ... in order."""
    start = time.perf_counter()
    n = len(problem.nodes)
    if list(problem.edges) != [(i, i + 1) for i in range(n - 1)]:
        raise ValueError("dynamic programming needs a chain: edges (i, i+1) in order")
    best = list(problem.node_cost[0])
    back: list[list[int]] = []
    for i in range(1, n):
        row, arg = [], []
        for b, cost_b in enumerate(problem.node_cost[i]):
            a = min(range(len(best)), key=lambda a: best[a] + problem.edge(i - 1, a, b))
            row.append(best[a] + problem.edge(i - 1, a, b) + cost_b)
            arg.append(a)
        best, back = row, back + [arg]
    last = min(range(len(best)), key=best.__getitem__)
    choice = [last]
    for arg in reversed(back):
        choice.append(arg[choice[-1]])
    choice.reverse()
    return LayoutPlan(tuple(choice), best[last], "dp", True, time.perf_counter() - start)


# The solver's objective is in microseconds. In seconds, steps of a few microseconds sit at
# CBC's absolute tolerances: it returned plans worse than the optimum, flagged optimal, on 5
# of 20 random problems priced like that (tests/layout/test_problem.py), and a compiled
# network's ILP plan came out costlier than the uniform plan it was also offered.
OBJECTIVE_SCALE = 1e6


def solve_ilp(problem: LayoutProblem, time_limit_s: float = 20.0) -> LayoutPlan:
    import pulp

    start = time.perf_counter()
    bound = _build(problem, relax=True)
    bound.solve(pulp.PULP_CBC_CMD(msg=False))
    lower = (pulp.value(bound.objective) or 0.0) / OBJECTIVE_SCALE
    prob, x = _build(problem, relax=False, with_vars=True)
    prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s))
    if pulp.LpStatus[prob.status] not in ("Optimal", "Not Solved") or \
            getattr(prob, "sol_status", 1) not in (1, 2):
        raise RuntimeError(f"layout ILP failed: {pulp.LpStatus[prob.status]}")
    choice = tuple(max(range(len(c)), key=lambda k: x[i][k].value() or 0.0)
                   for i, c in enumerate(problem.node_cost))
    cost = problem.cost(choice)
    optimal = getattr(prob, "sol_status", 1) == 1
    gap = 0.0 if cost <= 0 else max(0.0, (cost - lower) / cost)
    if not optimal:
        warnings.warn(f"layout ILP stopped at its {time_limit_s:.0f} s limit: using the best "
                      f"plan found, cost {cost:.6g} against a lower bound of {lower:.6g} "
                      f"(gap {gap:.2%})", stacklevel=2)
    return LayoutPlan(choice, cost, "ilp", optimal, time.perf_counter() - start,
                      0.0 if optimal else gap)


def _build(problem: LayoutProblem, relax: bool, with_vars: bool = False):
    import pulp

    prob = pulp.LpProblem("layout", pulp.LpMinimize)
    cat = "Continuous" if relax else "Binary"
    x = [[pulp.LpVariable(f"x_{i}_{k}", 0, 1, cat) for k in range(len(c))]
         for i, c in enumerate(problem.node_cost)]
    terms = [OBJECTIVE_SCALE * c * v for costs, xs in zip(problem.node_cost, x)
             for c, v in zip(costs, xs) if math.isfinite(c)]
    for i, xs in enumerate(x):
        prob += pulp.lpSum(xs) == 1, f"one_{i}"
        for k, c in enumerate(problem.node_cost[i]):
            if math.isinf(c):  # a candidate that cannot run is excluded, not priced
                prob += xs[k] == 0, f"never_{i}_{k}"
    for e, ((p, q), m) in enumerate(zip(problem.edges, problem.edge_cost)):
        if not any(v for row in m for v in row):
            continue  # a free edge needs no pair variables
        src, dst = problem.labels(e)
        y = [[pulp.LpVariable(f"y_{e}_{a}_{b}", 0, 1) for b in range(len(m[0]))]
             for a in range(len(m))]
        for a in range(len(m)):  # y's marginals are the two nodes' label indicators
            prob += pulp.lpSum(y[a]) == pulp.lpSum(
                x[p][c] for c in range(len(x[p])) if src[c] == a), f"out_{e}_{a}"
        for b in range(len(m[0])):
            prob += pulp.lpSum(y[a][b] for a in range(len(m))) == pulp.lpSum(
                x[q][c] for c in range(len(x[q])) if dst[c] == b), f"in_{e}_{b}"
        for a in range(len(m)):
            for b in range(len(m[0])):
                if math.isinf(m[a][b]):  # no transform between these layouts
                    prob += y[a][b] == 0, f"never_{e}_{a}_{b}"
                elif m[a][b]:
                    terms.append(OBJECTIVE_SCALE * m[a][b] * y[a][b])
    prob += pulp.lpSum(terms)
    return (prob, x) if with_vars else prob
