"""Placement rules: who runs where, as a pure function of the nodes."""
import pytest

from raytune_kernels.placement import NodeInfo, PlacementError, phased, plan

HEAD = NodeInfo("head", 8, 0, is_head=True)


def by_node(roles, kind):
    out = {}
    for r in roles:
        if r.kind == kind:
            out[r.node_id] = out.get(r.node_id, 0) + 1
    return out


def test_gpu_measurers_one_per_gpu_only_where_gpus_are():
    nodes = [HEAD, NodeInfo("g4", 16, 4), NodeInfo("g1", 8, 1), NodeInfo("cpu", 32, 0)]
    roles = plan(nodes, "gpu")
    assert by_node(roles, "measurer") == {"g4": 4, "g1": 1}
    assert sorted(r.index for r in roles if r.node_id == "g4" and r.kind == "measurer") == \
        [0, 1, 2, 3]
    # builders on the CPUs left: each GPU measurer keeps one CPU to drive its GPU
    assert by_node(roles, "builder") == {"g4": 12, "g1": 7, "cpu": 32}
    assert not phased(roles)


def test_cpu_measurers_own_dedicated_core_blocks_and_builders_get_the_rest():
    nodes = [HEAD, NodeInfo("a", 16), NodeInfo("b", 2)]
    roles = plan(nodes, "cpu", cores_per_measurer=2)
    m = [r for r in roles if r.kind == "measurer"]
    assert by_node(roles, "measurer") == {"a": 2, "b": 1}
    assert [r.index for r in m if r.node_id == "a"] == [0, 1]  # disjoint core blocks
    assert all(r.cores == 2 and r.cpus == 2 for r in m)
    assert by_node(roles, "builder") == {"a": 12}  # node b: its 2 cores are measuring
    assert "head" not in by_node(roles, "measurer") | by_node(roles, "builder")


def test_a_lone_head_measures_and_alternates_when_no_core_is_left():
    roles = plan([NodeInfo("solo", 2, is_head=True)], "cpu", cores_per_measurer=2)
    assert by_node(roles, "measurer") == {"solo": 1}
    assert phased(roles) and [r.cpus for r in roles if r.kind == "builder"] == [0.0]
    roles = plan([NodeInfo("solo", 2, is_head=True)], "cpu")
    assert by_node(roles, "measurer") == {"solo": 1} and by_node(roles, "builder") == {"solo": 1}


def test_a_joining_node_adds_roles_and_nothing_else_moves():
    before = plan([HEAD, NodeInfo("a", 8)], "cpu")
    after = plan([HEAD, NodeInfo("a", 8), NodeInfo("b", 8)], "cpu")
    assert [r for r in after if r.node_id == "a"] == [r for r in before if r.node_id == "a"]
    assert by_node(after, "measurer")["b"] == 2


def test_no_device_anywhere_is_a_named_error():
    with pytest.raises(PlacementError, match="no node can run a gpu measurer"):
        plan([HEAD, NodeInfo("cpu", 8)], "gpu")


def test_search_nodes_are_kept_for_search_actors_as_the_head_is():
    nodes = [HEAD, NodeInfo("s", 8, 0, search=True), NodeInfo("g", 8, 1)]
    for device in ("gpu", "cpu"):
        assert "s" not in by_node(plan(nodes, device), "measurer") | \
            by_node(plan(nodes, device), "builder")
    assert by_node(plan([NodeInfo("s", 2, search=True)], "cpu"), "measurer") == {"s": 1}
