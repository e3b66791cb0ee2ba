import math
import random

import pytest

from raytune_kernels.layout.problem import LayoutProblem, solve_brute, solve_dp, solve_ilp


def random_problem(rng: random.Random, n: int, chain: bool) -> LayoutProblem:
    k = [rng.randint(1, 4) for _ in range(n)]
    if chain:
        edges = [(i, i + 1) for i in range(n - 1)]
    else:  # a DAG: each node reads one to three earlier nodes (concats, residuals)
        edges = sorted({(rng.randrange(i), i) for i in range(1, n) for _ in range(rng.randint(1, 3))})
    costs = tuple(tuple(rng.uniform(1, 10) for _ in range(k[i])) for i in range(n))
    mats = tuple(tuple(tuple(0.0 if a == b else rng.uniform(0, 6) for b in range(k[q]))
                       for a in range(k[p])) for p, q in edges)
    return LayoutProblem(tuple(f"n{i}" for i in range(n)), costs, tuple(edges), mats)


@pytest.mark.parametrize("seed", range(30))
def test_ilp_equals_brute_force_on_random_graphs(seed):
    problem = random_problem(random.Random(seed), random.Random(seed).randint(2, 8), False)
    ilp, brute = solve_ilp(problem), solve_brute(problem)
    assert ilp.optimal and ilp.cost == pytest.approx(brute.cost, rel=1e-9, abs=1e-9)


def labelled_problem(rng: random.Random, n: int) -> LayoutProblem:
    """Candidates grouped by layout label, as the network problems are."""
    base = random_problem(rng, n, False)
    labels = [[rng.randrange(3) for _ in c] for c in base.node_cost]
    mats = tuple(tuple(tuple(0.0 if a == b else rng.uniform(0, 6) for b in range(3))
                       for a in range(3)) for _ in base.edges)
    src = tuple(tuple(labels[p]) for p, _ in base.edges)
    dst = tuple(tuple(labels[q]) for _, q in base.edges)
    return LayoutProblem(base.nodes, base.node_cost, base.edges, mats, src, dst)


@pytest.mark.parametrize("seed", range(20))
def test_ilp_equals_brute_force_with_layout_labels(seed):
    problem = labelled_problem(random.Random(500 + seed), random.Random(seed).randint(2, 8))
    assert solve_ilp(problem).cost == pytest.approx(solve_brute(problem).cost, abs=1e-9)


@pytest.mark.parametrize("seed", range(15))
def test_ilp_equals_dp_on_chains(seed):
    rng = random.Random(100 + seed)
    problem = random_problem(rng, rng.randint(2, 40), True)
    ilp, dp = solve_ilp(problem), solve_dp(problem)
    assert ilp.cost == pytest.approx(dp.cost, rel=1e-9, abs=1e-9)
    assert dp.cost == pytest.approx(problem.cost(dp.choice))


@pytest.mark.parametrize("seed", range(10))
def test_impossible_transforms_and_candidates_are_excluded_not_priced(seed):
    """inf marks a transform that does not exist or a kernel that cannot run: the ILP never
    picks it and still finds brute force's optimum over what can run."""
    rng = random.Random(seed)
    base = random_problem(rng, rng.randint(3, 7), False)
    mats = tuple(tuple(tuple(math.inf if (a != b and rng.random() < 0.3) else v
                             for b, v in enumerate(row)) for a, row in enumerate(m))
                 for m in base.edge_cost)
    costs = tuple(tuple(math.inf if (k and rng.random() < 0.2) else c for k, c in enumerate(cs))
                  for cs in base.node_cost)
    problem = LayoutProblem(base.nodes, costs, base.edges, mats)
    brute = solve_brute(problem)
    if math.isinf(brute.cost):
        return  # nothing feasible: brute force cannot compare
    ilp = solve_ilp(problem)
    assert ilp.cost == pytest.approx(brute.cost, rel=1e-9) and math.isfinite(ilp.cost)


def test_dp_refuses_non_chains():
    problem = random_problem(random.Random(3), 6, False)
    with pytest.raises(ValueError, match="needs a chain"):
        solve_dp(problem)


def scaled(problem: LayoutProblem, factor: float) -> LayoutProblem:
    return LayoutProblem(problem.nodes, tuple(tuple(c * factor for c in cs)
                                              for cs in problem.node_cost),
                         problem.edges, tuple(tuple(tuple(v * factor for v in row) for row in m)
                                              for m in problem.edge_cost),
                         problem.src_label, problem.dst_label)


@pytest.mark.parametrize("seed", range(20))
def test_ilp_is_exact_at_the_scale_of_real_networks(seed):
    """Steps of a few microseconds, in seconds, as compile_network prices them: the
    solver's tolerances must not decide between plans."""
    problem = scaled(labelled_problem(random.Random(900 + seed),
                                      random.Random(seed).randint(4, 8)), 1e-7)
    brute = solve_brute(problem)
    assert solve_ilp(problem).cost == pytest.approx(brute.cost, rel=1e-9, abs=0)
