"""cluster.yaml: valid for Ray's launcher, SSH open to a placeholder network only, and Ray's
token authentication really on: every `ray start` runs with it, one token reaches every
node, setup stops without one, and (slow) the file's own head command refuses a driver
without the token."""
import os
import pathlib
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

ROOT = pathlib.Path(__file__).parent.parent
CONFIG = ROOT / "cluster.yaml"


@pytest.fixture(scope="module")
def cfg():
    return yaml.safe_load(CONFIG.read_text())


def test_ray_accepts_the_config(cfg):
    pytest.importorskip("ray")
    from ray.autoscaler._private.util import prepare_config, validate_config
    validate_config(prepare_config(cfg))


def test_only_ssh_is_open_and_only_to_a_placeholder_network(cfg):
    rules = cfg["provider"]["security_group"]["IpPermissions"]
    assert [(r["FromPort"], r["ToPort"], r["IpProtocol"]) for r in rules] == [(22, 22, "tcp")]
    cidrs = [ip["CidrIp"] for ip in rules[0]["IpRanges"]]
    assert cidrs == ["203.0.113.10/32"]  # RFC 5737: reaches nobody until replaced
    assert "REPLACE the placeholder CIDR" in CONFIG.read_text()


def _starts(cfg) -> list[str]:
    return [c for c in cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
            if "ray start" in c]


def test_every_ray_start_runs_with_token_auth_and_the_dashboard_on_localhost(cfg):
    starts = _starts(cfg)
    assert len(starts) == 2 and all(c.startswith("RAY_AUTH_MODE=token ray start")
                                    for c in starts)
    head = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head
    commands = " ".join(cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
                        + cfg["setup_commands"])
    assert "RAY_AUTH_MODE=disabled" not in commands and "dashboard-port" not in commands
    assert "ray dashboard cluster.yaml" in CONFIG.read_text()  # how users reach it instead


def test_one_token_goes_to_every_node_and_setup_stops_without_it(cfg, tmp_path):
    assert cfg["file_mounts"]["/home/ubuntu/.ray/auth_token"] == "~/.ray/auth_token"
    check, chmod, profile = cfg["setup_commands"][:3]
    assert "ray get-auth-token --generate" in CONFIG.read_text()
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    env = {**os.environ, "HOME": str(home)}
    run = lambda cmd: subprocess.run(["bash", "-c", cmd], env=env, capture_output=True,
                                     text=True)
    missing = run(check)
    assert missing.returncode == 1 and "run 'ray get-auth-token --generate'" in missing.stderr
    (home / ".ray" / "auth_token").write_text("")
    assert run(check).returncode == 1  # an empty token is no token
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(16))
    for cmd in (check, chmod, profile, profile):  # the profile line is added once
        assert run(cmd).returncode == 0, cmd
    assert oct((home / ".ray" / "auth_token").stat().st_mode)[-3:] == "600"
    assert (home / ".bashrc").read_text().splitlines() == ["export RAY_AUTH_MODE=token"]


def test_the_project_requires_a_ray_with_token_auth():
    text = (ROOT / "pyproject.toml").read_text()
    low = re.search(r'"ray>=(\d+)\.(\d+)', text)
    assert low and (int(low.group(1)), int(low.group(2))) >= (2, 52)


@pytest.mark.slow
def test_the_head_command_refuses_a_driver_without_the_token(cfg, tmp_path):
    """The file's head command, run here on a free port in its own temp dir: a driver with
    the cluster's token connects, one with another token or none is refused."""
    pytest.importorskip("ray")
    head = next(c for c in cfg["head_start_ray_commands"] if "ray start" in c)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_tmp = tempfile.mkdtemp(prefix="rk_auth_", dir="/tmp")  # short: socket paths
    cmd = head.replace("--port=6379", f"--port={port}").replace(
        "--autoscaling-config=~/ray_bootstrap_config.yaml",
        f"--temp-dir={ray_tmp} --num-cpus=1 --disable-usage-stats")

    def home(name: str, token: str | None) -> dict:
        (tmp_path / name / ".ray").mkdir(parents=True)
        if token is not None:
            (tmp_path / name / ".ray" / "auth_token").write_text(token)
        return {**os.environ, "HOME": str(tmp_path / name)}

    cluster = home("cluster", secrets.token_hex(16))
    probe = f"import ray; ray.init(address='127.0.0.1:{port}'); print('CONNECTED')"

    def driver(env: dict) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              text=True, timeout=120)
    try:
        started = subprocess.run(["bash", "-c", cmd], env=cluster, capture_output=True,
                                 text=True, timeout=120)
        assert started.returncode == 0, started.stderr[-2000:]
        time.sleep(1)
        assert "CONNECTED" in driver({**cluster, "RAY_AUTH_MODE": "token"}).stdout
        wrong = driver({**home("wrong", secrets.token_hex(16)), "RAY_AUTH_MODE": "token"})
        assert wrong.returncode != 0 and "CONNECTED" not in wrong.stdout
        none = driver(home("none", None))
        assert none.returncode != 0 and "CONNECTED" not in none.stdout
    finally:  # only this head's processes: `ray stop` would end every Ray here
        for proc in pathlib.Path("/proc").glob("[0-9]*"):
            try:
                if ray_tmp.encode() in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def test_gpu_workers_and_a_cpu_head(cfg):
    types = cfg["available_node_types"]
    assert types[cfg["head_node_type"]]["max_workers"] == 0
    assert any(t["node_config"]["InstanceType"].startswith(("g", "p")) for t in types.values())


def test_search_workers_offer_the_resource_search_actors_are_placed_by(cfg):
    from raytune_kernels.placement import SEARCH_RESOURCE

    search = cfg["available_node_types"]["search_worker"]
    assert search["resources"].get(SEARCH_RESOURCE, 0) >= 1
    assert "GPU" not in search["resources"]
