"""Every example runs, bounded and local: examples/*.py with few trials, and the cluster
example and `raytune-kernels tune` submitted with `ray job submit` to a head started here
(token authentication on, as cluster.yaml has it), their records read back from where
they were sent. A new example fails test_every_example_is_run_here until it is run here."""
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from raytune_kernels.tune.records import load_records

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BIN = os.path.dirname(sys.executable)  # ray and raytune-kernels, beside this interpreter
# the cheapest model the CLI and the examples take (path/to/file.py:factory): one task
TINY = """import torch

def make():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU()).eval()
    return net, (torch.randn(4, 64),)
"""
TINY_KEY_TEXT = "dense 4x64 -> 4x32 +bias+relu"


def run(argv: list[str], cwd, env: dict, timeout: float = 300) -> str:
    """stdout and stderr of `argv`, which must succeed; the process group (a local Ray
    the example started) is killed when it runs past `timeout`."""
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
        pytest.fail(f"{argv} ran past {timeout} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def local_env() -> dict:
    # "local": a Ray of the example's own, never a cluster another process left running
    # (ray.init() without an address joins the one /tmp/ray/ray_current_cluster names)
    return {**os.environ, "RAY_ADDRESS": "local", "PATH": f"{BIN}:{os.environ['PATH']}"}


def test_every_example_is_run_here():
    ran_here = {"extract_tasks.py", "tune_resnet18.py", "tune_on_cluster.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == ran_here


def test_extract_tasks_example():
    out = run([sys.executable, EXAMPLES / "extract_tasks.py", "resnet18"], ROOT, local_env())
    found = re.search(r"21 tasks; .* max abs error (\S+)", out)
    assert found and float(found.group(1)) < 1e-4, out[-2000:]


@pytest.mark.e2e
def test_tune_resnet18_example(tmp_path):
    records = tmp_path / "r18.jsonl"
    out = run([sys.executable, EXAMPLES / "tune_resnet18.py", "--trials", "4",
               "--records", records], tmp_path, local_env())
    assert "estimated network latency" in out and "compiled: " in out, out[-2000:]
    assert len(load_records(str(records)).records) == 4
    assert (tmp_path / "resnet18_profile.png").stat().st_size > 0


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def kill_head(ray_tmp: str, gcs_port: int) -> None:
    """SIGKILL this head's processes and all their children: those whose command line names
    its temp dir, or its GCS address (the client server); never another Ray on this machine
    (`ray stop` would end them all). Children are found first: killed parents orphan them."""
    procs = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        procs[int(proc.name)] = (ppid, cmdline)
    marks = (ray_tmp.encode(), f":{gcs_port}\0".encode())
    doomed = {pid for pid, (_, cmd) in procs.items() if any(m in cmd for m in marks)}
    while True:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in doomed} - doomed
        if not more:
            break
        doomed |= more
    for pid in doomed - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A Ray head of our own with the dashboard (its job server) on free ports and token
    authentication on: (the dashboard's address, the environment that holds the token)."""
    pytest.importorskip("aiohttp", reason="ray job submit needs ray[default] (the dashboard)")
    work = tmp_path_factory.mktemp("head")
    (work / "auth_token").write_text(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(work / "auth_token"),
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    ray_tmp = tempfile.mkdtemp(prefix="rkj_", dir="/tmp")  # short: Ray's socket paths
    gcs, dashboard, client, agent = free_ports(4)
    try:
        run([f"{BIN}/ray", "start", "--head", f"--port={gcs}", "--num-cpus=2", "--num-gpus=0",
             f"--temp-dir={ray_tmp}", "--disable-usage-stats", "--include-dashboard=true",
             f"--dashboard-port={dashboard}", f"--ray-client-server-port={client}",
             f"--dashboard-agent-listen-port={agent}", "--object-store-memory=100000000"],
            work, env, timeout=120)
        yield f"http://127.0.0.1:{dashboard}", env, ray_tmp
    finally:
        kill_head(ray_tmp, gcs)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def submit(head, working_dir, *entrypoint) -> str:
    address, env, _ = head
    return run([f"{BIN}/ray", "job", "submit", "--address", address,
                "--working-dir", working_dir, "--", *entrypoint], working_dir, env)


@pytest.mark.e2e
def test_cluster_example_under_ray_job_submit(head, tmp_path):
    (tmp_path / "tiny.py").write_text(TINY)
    store = f"file://{tmp_path}/store/"
    out = submit(head, EXAMPLES, "python", "tune_on_cluster.py", "--records", store,
                 "--model", f"{tmp_path}/tiny.py:make", "--trials", "8")
    assert "llvm: 8 trials" in out and TINY_KEY_TEXT in out, out[-3000:]
    records = load_records(store).records
    assert len(records) == 8 and any(r.ok for r in records)


@pytest.mark.e2e
def test_cli_tune_under_ray_job_submit(head, tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "tiny.py").write_text(TINY)  # the model travels with the working dir
    records = tmp_path / "tiny.jsonl"
    out = submit(head, tmp_path / "job", "raytune-kernels", "tune", "tiny.py:make",
                 "--trials", "8", "--records", str(records), "--address", "auto")
    assert TINY_KEY_TEXT in out and "succeeded" in out, out[-3000:]
    assert len(load_records(str(records)).records) == 8


@pytest.mark.e2e
def test_a_job_runs_in_a_temporary_copy_of_its_working_dir(head, tmp_path):
    """Why the examples send records to an absolute path or a URI: a relative one would
    land in this copy, inside Ray's session directory on the head."""
    (tmp_path / "here.txt").write_text("x")
    out = submit(head, tmp_path, "python", "-c",
                 "import os; print('CWD', os.getcwd(), sorted(os.listdir()))")
    cwd = re.search(r"^CWD (\S+) \['here.txt'\]$", out, re.M)
    assert cwd and cwd.group(1).startswith(head[2]) and cwd.group(1) != str(tmp_path), out


@pytest.mark.e2e
def test_a_submission_without_the_token_is_refused(head, tmp_path):
    """The dashboard's job server checks the token: none (auth off on this side, no
    ~/.ray/auth_token) is unauthorized, another one forbidden."""
    address, env, _ = head
    (tmp_path / "wrong").write_text(secrets.token_hex(32))
    bare = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH_")}
    for extra, answer in (({}, "Unauthorized"),
                          ({"RAY_AUTH_MODE": "token",
                            "RAY_AUTH_TOKEN_PATH": str(tmp_path / "wrong")}, "Forbidden")):
        done = subprocess.run([f"{BIN}/ray", "job", "submit", "--address", address, "--",
                               "true"], env={**bare, **extra, "HOME": str(tmp_path)},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and answer in done.stdout + done.stderr, done.stderr[-2000:]
