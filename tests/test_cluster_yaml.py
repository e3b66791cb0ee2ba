"""cluster.yaml: valid for Ray's launcher, and it opens nothing but SSH."""
import pathlib

import pytest
import yaml

CONFIG = pathlib.Path(__file__).parent.parent / "cluster.yaml"


@pytest.fixture(scope="module")
def cfg():
    return yaml.safe_load(CONFIG.read_text())


def test_ray_accepts_the_config(cfg):
    pytest.importorskip("ray")
    from ray.autoscaler._private.util import prepare_config, validate_config
    validate_config(prepare_config(cfg))


def test_only_ssh_is_open_to_the_outside(cfg):
    rules = cfg["provider"]["security_group"]["IpPermissions"]
    assert [(r["FromPort"], r["ToPort"], r["IpProtocol"]) for r in rules] == [(22, 22, "tcp")]


def test_dashboard_stays_on_localhost_and_auth_stays_on(cfg):
    head = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head
    text = CONFIG.read_text()
    commands = " ".join(cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
                        + cfg["setup_commands"])
    assert "RAY_AUTH_MODE=disabled" not in commands and "dashboard-port" not in commands
    assert "ray dashboard cluster.yaml" in text  # how users reach it instead


def test_gpu_workers_and_a_cpu_head(cfg):
    types = cfg["available_node_types"]
    assert types[cfg["head_node_type"]]["max_workers"] == 0
    assert any(t["node_config"]["InstanceType"].startswith(("g", "p")) for t in types.values())
