"""Where measurers and builders run on a cluster: a pure function of the nodes.

Rules (the same on a laptop and on a cluster):
- measurers run on worker nodes; the head runs the scheduler and cost model, and
  measures only when it is the whole cluster; nodes that offer the custom resource
  SEARCH_RESOURCE are kept for search actors as the head is (cluster.yaml's search_worker);
- a GPU target gets one measurer per GPU on every node that has GPUs, and none elsewhere;
- a CPU target gets measurers that own `cores_per_measurer` cores each, on a quarter of a
  node's cores (at least one measurer): building a candidate takes several times longer
  than timing it (bench/throughput.py: measurers idle 85% with one builder per measurer),
  so builders get the rest;
- builders take the CPUs no measurer owns, on every node; a cluster where no CPU is left
  builds and measures in alternation (builders then reserve no CPU).
Re-planning after a node joins or leaves gives the new node its roles and drops the lost
node's; the pipeline applies the difference.
"""
from __future__ import annotations

from dataclasses import dataclass

MEASURE_SHARE = 4  # one core in this many measures; the others build
SEARCH_RESOURCE = "raytune_search"  # a node offering it hosts search actors, not measurers


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    cpus: int
    gpus: int = 0
    is_head: bool = False
    search: bool = False  # offers SEARCH_RESOURCE: kept for search actors


@dataclass(frozen=True)
class Role:
    """One actor to run: a measurer (its core block or GPU is `index` on its node) or a
    builder, with the Ray CPUs it reserves."""

    node_id: str
    kind: str  # "measurer" or "builder"
    device: str  # "cpu" or "gpu" (builders: "cpu")
    index: int
    cpus: float
    cores: int = 0  # cores a CPU measurer owns (pinned)


class PlacementError(ValueError):
    """No node can measure for the target (named with what the cluster has)."""


def plan(nodes: list[NodeInfo], device: str, cores_per_measurer: int = 1,
         measurers_per_node: int | None = None) -> list[Role]:
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    workers = [n for n in nodes if not (n.is_head or n.search)] or list(nodes)
    roles: list[Role] = []
    for node in workers:
        if device == "gpu":
            count = node.gpus
            owned = count  # each GPU measurer keeps one CPU to drive its GPU
            roles += [Role(node.node_id, "measurer", "gpu", g, 1.0) for g in range(count)]
        else:
            fit = node.cpus // cores_per_measurer
            count = min(fit, measurers_per_node or
                        max(1, node.cpus // (MEASURE_SHARE * cores_per_measurer)))
            owned = count * cores_per_measurer
            roles += [Role(node.node_id, "measurer", "cpu", i, float(cores_per_measurer),
                           cores_per_measurer) for i in range(count)]
        spare = max(0, node.cpus - owned)
        roles += [Role(node.node_id, "builder", "cpu", b, 1.0) for b in range(spare)]
    if not any(r.kind == "measurer" for r in roles):
        have = ", ".join(f"{n.node_id[:8]}: {n.cpus} CPU {n.gpus} GPU" for n in nodes)
        raise PlacementError(f"no node can run a {device} measurer ({have or 'no nodes'})")
    if not any(r.kind == "builder" for r in roles):  # alternate: builders hold no CPU
        roles += [Role(n.node_id, "builder", "cpu", 0, 0.0) for n in workers]
    return roles


def phased(roles: list[Role]) -> bool:
    """No core is free of measurement: builds and measurements must alternate."""
    return all(r.cpus == 0 for r in roles if r.kind == "builder")
