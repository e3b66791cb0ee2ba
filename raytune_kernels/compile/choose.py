"""Choosing each step's kernel and layouts, the same for CPU and GPU networks: prune each
step's candidates, solve the layout problem (the ILP over every candidate, or "uniform":
the best plan that keeps one layout family), and the tuner's estimate of the network."""
from __future__ import annotations

from typing import Callable

from raytune_kernels.frontend.partition import GlueStep, Partition
from raytune_kernels.layout.graph import NCHW, Bordering, Candidate, layout_problem
from raytune_kernels.layout.problem import LayoutPlan, LayoutProblem, solve_ilp
from raytune_kernels.space import Config
from raytune_kernels.task import Task
from raytune_kernels.tune.records import Record

TORCH = "torch"  # the config of a candidate that runs PyTorch's kernel
KEEP = 4  # candidates kept per step (the fastest, within SLACK of the best)
SLACK = 1.3

# solves a layout problem within a time limit: solve_ilp in this process, or the
# LayoutActor's on a Ray session (actors/layout_actor.py)
Solver = Callable[[LayoutProblem, float], LayoutPlan]


def candidates_from_records(task: Task, records: list[Record],
                            layouts: Callable[[Task, Config], tuple[str, str]],
                            threads: int | None = None) -> list[Candidate]:
    """The best measured kernel of `task` for each (input, output) layout pair (among the
    records at `threads` threads, when given); each candidate carries its config.
    `layouts` says what a config reads and writes (the backend's)."""
    best: dict[tuple[str, str], tuple[float, dict]] = {}
    for r in records:
        if r.task_key == task.key and r.ok and (threads is None or r.threads == threads):
            pair = layouts(task, Config.from_json(r.config))
            if pair not in best or r.median < best[pair][0]:
                best[pair] = (r.median, r.config)
    return [Candidate(a, b, t, Config.from_json(cfg))
            for (a, b), (t, cfg) in sorted(best.items())]


def estimated_latency(part: Partition, best: dict[str, Record],
                      torch_s: dict[str, float] | None = None) -> float:
    """The tuner's estimate of a network: sum of weight x best record per task, and
    torch's time for tasks without one when falling back to torch."""
    total = sum(t.weight * best[t.key].median for t in part.tasks if t.key in best)
    if torch_s:
        total += sum(t.weight * torch_s[t.key] for t in part.tasks if t.key not in best)
    return total


def prune(cands: list[Candidate], family_of: Callable | None) -> list[Candidate]:
    fastest = min(c.seconds for c in cands)
    ranked = sorted(cands, key=lambda c: c.seconds)
    keep = [c for c in ranked if c.seconds <= SLACK * fastest][:KEEP]
    if family_of is not None:
        for fam in {family_of(c.in_layout) for c in ranked}:
            same = [c for c in ranked if family_of(c.in_layout) == fam == c.out_layout]
            keep += [c for c in same[:KEEP] if c not in keep]
    return keep


def choose(part: Partition, cands: list[list[Candidate]], layout: str,
            transform: Callable[[tuple, str, str], float], time_limit_s: float,
            solver: Solver = solve_ilp, bordering: Bordering | None = None
            ) -> tuple[LayoutPlan, list[Candidate]]:
    """The layout plan and each step's candidate: by the ILP over every candidate, or
    ("uniform") the best plan that keeps one layout family wherever a step has it.
    `solver` solves each layout problem; `bordering` says which producers write their
    reader's border themselves (layout_problem)."""
    def solve(per_step: list[list[Candidate]]):
        problem, node_cands = step_problem(part, per_step, transform, bordering)
        plan = solver(problem, time_limit_s)
        n0 = len(part.graph.inputs)
        return plan, [node_cands[n0 + i][plan.choice[n0 + i]] for i in range(len(part.steps))]

    if layout == "ilp":
        return solve(cands)
    best = None
    for fam in families(cands):
        per = [[c for c in cs if layout_family(c.in_layout) == fam == c.out_layout]
               or cs for cs in cands]
        plan, chosen = solve(per)
        if best is None or plan.cost < best[0].cost:
            best = (plan, chosen)
    return best


def step_problem(part: Partition, per_step: list[list[Candidate]],
                 transform: Callable[[tuple, str, str], float],
                 bordering: Bordering | None = None):
    """layout_problem() with the candidates given per step (in part.steps order)."""
    by_node = {}
    for s, cs in zip(part.steps, per_step):
        by_node[s.node if isinstance(s, GlueStep) else id(s)] = cs
    return layout_problem(part, lambda s: by_node[s.name if hasattr(s, "op") else id(s)],
                          transform, bordering)


def layout_family(label: str) -> str:
    return label.partition("/")[0]


def families(cands: list[list[Candidate]]) -> list[str]:
    seen = {}
    for cs in cands:
        for c in cs:
            if layout_family(c.in_layout) == c.out_layout:
                seen[c.out_layout] = True
    return list(seen) or [NCHW]
