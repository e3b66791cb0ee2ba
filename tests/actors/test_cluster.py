"""A simulated multi-node Ray cluster on this machine (ray.cluster_utils.Cluster): placement
on real nodes, a node joining and a node leaving mid-run, and a driver restart that resumes.

It runs in a subprocess: a cluster needs its own Ray, apart from the session's local one.
"""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # a Ray cluster of several nodes: CI runs it in its e2e step

SCRIPT = '''
import os, sys, traceback

def main(cluster_box):
    import json, threading, time
    import torch, ray
    from ray.cluster_utils import Cluster

    import raytune_kernels as rk
    from raytune_kernels.tune.records import load_records
    from raytune_kernels.cpu.machine import cpu_info
    from raytune_kernels.cpu.schedules import space_for
    from raytune_kernels.measure import MeasureOptions
    import random

    small = {"object_store_memory": 80 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, **small})
    cluster_box.append(cluster)
    workers = [cluster.add_node(num_cpus=2, **small) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    from actors.pipeline import MeasurePipeline
    out = {"workers": [w.node_id for w in workers], "head": cluster.head_node.node_id}

    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU()).eval()
    task = rk.extract_tasks(model, (torch.randn(1, 16, 8, 8),))[0]
    space = space_for(task.compute, cpu_info())
    rng = random.Random(0)
    cfgs = list(dict.fromkeys(space.sample(rng) for _ in range(40)))
    # each measurement lasts >= 0.3 s, so the node removed mid-run has one in flight
    opts = MeasureOptions(threads=1, min_repeat_ms=100, repeats=3, timeout_s=30)

    p = MeasurePipeline.on_cluster(opts)
    out["measurers"] = [ray.get(s.actor.where.remote())[0] for s in p.slots]
    out["builders"] = [ray.get(b.node.remote()) for b in p.builders]

    joined = cluster.add_node(num_cpus=2, **small)
    cluster.wait_for_nodes()
    first = p.run([(task, c) for c in cfgs[:6]])
    out["after_join"] = [ray.get(s.actor.where.remote())[0] for s in p.slots]
    out["joined"] = joined.node_id
    out["first_ok"] = sum(r.ok for r in first)

    lost = workers[0]
    kill = threading.Timer(1.5, cluster.remove_node, [lost]); kill.daemon = True; kill.start()
    second = p.run([(task, c) for c in cfgs[6:]])
    out["second"] = [r.error_kind for r in second]
    out["after_loss"] = sorted({s.node_id for s in p.slots})
    out["lost"] = lost.node_id
    out["redone"] = p.stats.redone  # how many were caught in flight (timing decides)
    p.shutdown()

    # GPU target: measurers only where GPUs are (a node with a logical GPU stands in)
    gnode = cluster.add_node(num_cpus=2, num_gpus=1, **small)
    cluster.wait_for_nodes()
    g = MeasurePipeline.on_cluster(opts, device="gpu", arch="sm_80")
    out["gpu_measurers"] = [s.node_id for s in g.slots]
    out["gpu_node"] = gnode.node_id
    out["gpu_builders"] = len(g.builders)
    g.shutdown()
    cluster.remove_node(gnode)

    # search actors: spread over the nodes, or kept to the nodes offering the resource
    from actors.tuning_actors import RaySearchPool
    from raytune_kernels.backend import backend_for
    from raytune_kernels.placement import SEARCH_RESOURCE
    from raytune_kernels.tune.search import SearchOptions
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 16, 1)).eval()
    x = torch.randn(1, 8, 8, 8)
    tasks = rk.extract_tasks(net, (x,))
    backend = backend_for("llvm", cpu_info())
    pool = RaySearchPool(tasks, backend, 0, SearchOptions(), num_search=2, spread=True)
    out["search_spread"] = pool.nodes()
    out["search_proposed"] = [len(c) for c in pool.propose_many([(t.key, 2) for t in tasks])]
    for a in pool.actors + [pool.model]:
        ray.kill(a)
    snode = cluster.add_node(num_cpus=1, resources={SEARCH_RESOURCE: 4}, **small)
    cluster.wait_for_nodes()
    pool = RaySearchPool(tasks, backend, 0, SearchOptions(), num_search=2, spread=True)
    out["search_kept"], out["search_node"] = pool.nodes(), snode.node_id
    for a in pool.actors + [pool.model]:
        ray.kill(a)

    # a tuning run that loses a node, then a restarted driver that resumes its records
    # (rounds streamed: every worker has a builder core of its own)
    path = sys.argv[1]
    kill = threading.Timer(4.0, cluster.remove_node, [workers[1]]); kill.daemon = True; kill.start()
    res = rk.tune_network(net, (x,), trials=24, records=path, batch=4, verbose=False,
                          address=cluster.address)
    out["tune_trials"], out["tune_setup"] = res.trials, res.setup
    out["records_after_loss"] = len(load_records(path).records)
    ray.shutdown()
    ray.init(address=cluster.address, log_to_driver=False)
    again = rk.tune_network(net, (x,), trials=32, records=path, batch=4, verbose=False,
                            address=cluster.address)
    recs = load_records(path).records
    out["resumed_trials"] = again.trials
    out["records_after_resume"] = len(recs)
    out["distinct"] = len({(r.task_key, r.config_key()) for r in recs})
    print("RESULT " + json.dumps(out), flush=True)


box = []
try:
    main(box)
    code = 0
except BaseException:
    traceback.print_exc()
    code = 1
finally:
    for c in box:
        try:
            import ray
            ray.shutdown()
            c.shutdown()
        except Exception:
            pass
    sys.stdout.flush()
    os._exit(code)
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("cluster") / "r.jsonl"
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.argv[1:] = [%r]\n" % str(path)
                           + SCRIPT], capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def test_measurers_and_builders_run_on_workers_not_the_head(run):
    assert sorted(run["measurers"]) == sorted(run["workers"])  # one per 2-CPU worker
    assert sorted(run["builders"]) == sorted(run["workers"])  # on the CPU left
    assert run["head"] not in run["measurers"] + run["builders"]


def test_gpu_measurers_only_on_the_node_with_a_gpu(run):
    assert run["gpu_measurers"] == [run["gpu_node"]]
    assert run["gpu_builders"] >= 3  # CUDA builds on the CPUs of every worker


def test_a_node_that_joins_gets_a_measurer(run):
    assert run["joined"] in run["after_join"] and run["first_ok"] == 6


def test_a_node_that_leaves_costs_only_its_trials_in_flight(run):
    assert len(run["second"]) >= 24 and all(k is None for k in run["second"]), run["second"]
    assert run["lost"] not in run["after_loss"] and run["after_loss"]
    assert run["redone"] >= 1  # the lost node's measurement was done again elsewhere


def test_search_actors_spread_over_the_nodes_or_keep_to_the_search_nodes(run):
    assert len(set(run["search_spread"])) == 2 and run["search_proposed"] == [2, 2]
    assert run["search_kept"] == [run["search_node"]] * 2


def test_tuning_survives_node_loss_and_a_restarted_driver_resumes(run):
    assert run["tune_trials"] == 24 and run["records_after_loss"] == 24
    # rounds streamed (each worker builds on a core of its own); its search actors were
    # dealt to the search node, which measured nothing
    assert run["tune_setup"]["streamed"] and run["tune_setup"]["measurers"] >= 1
    assert set(run["tune_setup"]["search_nodes"]) == {run["search_node"]}
    assert run["resumed_trials"] == 32 and run["records_after_resume"] == 32
    assert run["distinct"] == 32  # nothing measured twice across the two drivers
