"""Chaos benchmark: a tuning run with faults injected at random moments, then an account
of every trial.

    python bench/chaos.py [--model resnet18] [--tasks 6] [--trials 300] [--fault-every 6]

A local Ray cluster is started for the run (ray.cluster_utils: a head and `--nodes` worker
nodes of 2 CPUs, its own temp dir); the driver runs tune_tasks on the model's first
`--tasks` tasks in a child process, against that cluster, with records in a temp dir. While
it runs, at exponentially distributed moments (mean `--fault-every` seconds), one of:

- sigkill_builder / sigkill_measurer: SIGKILL of a builder's or measurer's worker process
  (found by the title Ray gives it, ray::BuilderActor / ray::MeasurerActor);
- ray_kill_builder / ray_kill_measurer: ray.kill of one (the pipeline names its actors);
- remove_node: a worker node removed (its actors and the work in flight on it lost), and
  a fresh node joined;
- driver_restart: SIGKILL of the driver, then a new driver that resumes the records;
- disk_full: the workers' temp directory (a small tmpfs mounted for the run, in a mount
  namespace of its own: `unshare`) filled for `--full-s` seconds, and on until a build or
  load has met it (the pipeline logs a host-fault retry; at most FULL_MAX_S), then emptied;

and, inside the builders (RAYTUNE_KERNELS_CHAOS, raytune_kernels/cpu/faults.py), candidates
replaced by kernels that segfault, hang, write NaN or write nothing, at `--rates`.

Then: trials_recorded (records of those tasks), duplicates (a task and config recorded
twice), lost (requested trials never recorded), hung (the run passed --deadline),
wrong_kernels_chosen (each task's best record rebuilt and checked against its reference in
a child process; an injected fault chosen counts too), the faults injected by kind, and
the records' error kinds. Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import collections
import errno
import glob
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time

from raytune_kernels import extract_tasks, zoo
from raytune_kernels.cpu.faults import CHAOS_ENV
from raytune_kernels.cpu.machine import cpu_info
from raytune_kernels.cpu.probe import check_isolated
from raytune_kernels.space import Config
from raytune_kernels.tune.records import best_per_task, load_records

FULL_MAX_S = 12.0  # disk_full's longest hold: under the pipeline's retries (1 + 4 + 16 s), so a
# candidate that meets the full disk first is built again once it is emptied, not lost

DRIVER = """
import sys
import raytune_kernels as rk
from raytune_kernels import zoo
model, inputs = zoo.load(sys.argv[1])
tasks = rk.extract_tasks(model, inputs)[:int(sys.argv[2])]
if sys.argv[6]:  # the job's workers put their temp files on the filesystem disk_full fills
    import ray
    ray.init(address=sys.argv[5], runtime_env={"env_vars": {"TMPDIR": sys.argv[6]}},
             log_to_driver=False, configure_logging=False)
rk.tune_tasks(tasks, trials=int(sys.argv[3]), records=sys.argv[4], address=sys.argv[5],
              verbose=False, batch=8)
"""
KILLS = ("sigkill_builder", "sigkill_measurer", "ray_kill_builder", "ray_kill_measurer",
         "remove_node", "driver_restart", "disk_full")
NAMESPACE_ENV = "RK_CHAOS_PRIVATE_MOUNTS"
SMALL = {"object_store_memory": 80 * 1024 * 1024}


def kill_tree_of(marker: str) -> None:
    """SIGKILL every process whose command line holds `marker` (this run's Ray)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def actor_pids(class_name: str) -> list[int]:
    """Worker processes running an actor of `class_name` (Ray titles them ray::NAME)."""
    pids = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(f"ray::{class_name}".encode()):
                    pids.append(int(pid))
        except (OSError, ValueError):
            pass
    return pids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--nodes", type=int, default=2, help="worker nodes (2 CPUs each) beside "
                    "the head; remove_node takes one away and a new one joins")
    ap.add_argument("--fault-every", type=float, default=6.0, help="mean seconds between "
                    "process kills")
    ap.add_argument("--rates", default="segfault=0.02,hang=0.004,nan=0.02,wrong=0.02",
                    help="candidate faults injected by the builders (per candidate)")
    ap.add_argument("--deadline", type=float, default=1800.0, help="seconds before the run "
                    "counts as hung")
    ap.add_argument("--kills", default=",".join(KILLS), help="faults to inject besides the "
                    "candidates', comma-separated; with --in-turn they come in this order, "
                    "else at random")
    ap.add_argument("--full-s", type=float, default=3.0, help="seconds disk_full keeps the "
                    "workers' temp dir full")
    ap.add_argument("--in-turn", action="store_true")
    ap.add_argument("--max-faults", type=int, default=0, help="stop injecting after this "
                    "many (0: no limit); with --in-turn and one per kind, each kind once")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    kinds = [k for k in args.kills.split(",") if k]
    if not kinds or set(kinds) - set(KILLS):
        ap.error(f"--kills takes some of {', '.join(KILLS)}")
    if args.nodes < 1:
        ap.error("--nodes must be at least 1")
    if "disk_full" in kinds and os.environ.get(NAMESPACE_ENV) != "1":
        return in_private_mounts(ap)
    work = tempfile.mkdtemp(prefix="rk_chaos_")
    ray_tmp = tempfile.mkdtemp(prefix="rkc_", dir="/tmp")  # short: Ray's socket paths
    records, faults_log = os.path.join(work, "records.jsonl"), os.path.join(work, "faults")
    token = os.path.join(work, "auth_token")  # this run's Ray token, for every process
    with open(token, "w") as f:
        f.write(secrets.token_hex(32))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token)
    os.environ[CHAOS_ENV] = f"{args.rates},log={faults_log}"
    scratch = None
    if "disk_full" in kinds:  # the workers' temp dir: a small filesystem of its own
        scratch = tempfile.mkdtemp(prefix="rk_scratch_")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", scratch],
                       check=True)
    import ray  # after the environment above: Ray reads RAY_AUTH_MODE when imported
    from ray.cluster_utils import Cluster

    from actors.pipeline import HOST_RETRY_LOG

    start = time.perf_counter()
    kills: collections.Counter = collections.Counter()
    hung, cluster = False, None
    try:
        cluster = Cluster(initialize_head=True, connect=False, head_node_args={
            "num_cpus": 1, "temp_dir": ray_tmp, **SMALL})
        workers = [cluster.add_node(num_cpus=2, **SMALL) for _ in range(args.nodes)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        while True:
            driver = subprocess.Popen([sys.executable, "-c", DRIVER, args.model,
                                       str(args.tasks), str(args.trials), records,
                                       cluster.address, scratch or ""],
                                      stdout=subprocess.DEVNULL,
                                      stderr=open(os.path.join(work, "driver.log"), "ab"))
            restarted = False
            while driver.poll() is None:
                if time.perf_counter() - start > args.deadline:
                    hung = True
                    driver.kill()
                    break
                wait = rng.expovariate(1.0 / args.fault_every)
                try:
                    driver.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if not os.path.exists(records) or not os.path.getsize(records):
                    continue  # nothing measured yet: faults land in a run that measures
                if args.max_faults and sum(kills.values()) >= args.max_faults:
                    continue
                kind = kinds[sum(kills.values()) % len(kinds)] if args.in_turn else \
                    rng.choice(kinds)
                if kind == "driver_restart":
                    driver.kill()
                    driver.wait()
                    kills[kind] += 1
                    restarted = True
                    break
                met = lambda: logged(ray_tmp, HOST_RETRY_LOG)  # noqa: E731
                if inject(kind, rng, cluster, workers, scratch, args.full_s, met):
                    kills[kind] += 1
            if hung or (not restarted and driver.returncode == 0):
                break
            if not restarted:  # the driver failed by itself: that is a finding, not a fault
                print(f"driver exited with status {driver.returncode}; see "
                      f"{os.path.join(work, 'driver.log')}", file=sys.stderr)
                hung = True
                break
        wall = time.perf_counter() - start
        report = account(args, records, faults_log, kills, hung, wall)
        report["host_fault_retries"] = logged(ray_tmp, HOST_RETRY_LOG)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        kill_tree_of(ray_tmp)
        if scratch:
            subprocess.run(["umount", "-l", scratch])
    print(json.dumps(report))
    return 0 if report["ok"] else 1


def logged(ray_tmp: str, text: str) -> int:
    """Lines holding `text` in the Ray logs of the run (its actors' stderr)."""
    n = 0
    logs = {os.path.realpath(p) for p in glob.glob(os.path.join(ray_tmp, "session_*", "logs",
                                                                 "*.err"))}
    for log in logs:  # session_latest is a link to the session's own directory
        with open(log, errors="replace") as f:
            n += sum(text in line for line in f)
    return n


def inject(kind: str, rng: random.Random, cluster, workers: list, scratch: str | None,
           full_s: float, met) -> bool:
    """One fault of `kind` now; whether it was injected (not: nothing to hit just now).
    `met()` counts the host-fault retries logged so far: a full disk is held until one more
    than before, so that it is met, not merely filled between two builds."""
    import ray

    from actors.pipeline import NAMESPACE

    if kind.startswith("sigkill_"):
        pids = actor_pids("BuilderActor" if kind == "sigkill_builder" else "MeasurerActor")
        if not pids:
            return False
        try:
            os.kill(rng.choice(pids), signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True
    if kind.startswith("ray_kill_"):  # the pipeline names its actors for this
        role = "builder-" if kind == "ray_kill_builder" else "measurer-"
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == NAMESPACE and a["name"].startswith(role)]
        if not names:
            return False
        try:
            ray.kill(ray.get_actor(rng.choice(names), namespace=NAMESPACE), no_restart=False)
        except ValueError:  # gone meanwhile
            return False
        return True
    if kind == "remove_node":  # one worker node leaves; a fresh one joins
        gone = workers.pop(rng.randrange(len(workers)))
        cluster.remove_node(gone)
        workers.append(cluster.add_node(num_cpus=2, **SMALL))
        return True
    if kind == "disk_full":
        fill = os.path.join(scratch, "fill")
        with open(fill, "wb") as f:
            try:
                while True:
                    f.write(bytes(1 << 20))
                    f.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        before, since = met(), time.perf_counter()
        time.sleep(full_s)
        while met() == before and time.perf_counter() - since < FULL_MAX_S:
            time.sleep(0.25)
        os.unlink(fill)
        return True
    raise ValueError(kind)


def in_private_mounts(ap) -> int:
    """Run this script again in a mount namespace of its own, where it may mount the small
    filesystem disk_full fills (as root: unshare -m; otherwise as root of a new user
    namespace: unshare -rm); the mount goes away with the process."""
    flags = ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]
    where = tempfile.mkdtemp(prefix="rk_probe_mount_")
    try:  # a namespace of our own, and a tmpfs mounted in it
        probe = subprocess.run(["unshare", *flags, "mount", "-t", "tmpfs", "-o", "size=1m",
                                "tmpfs", where], capture_output=True, text=True)
    except FileNotFoundError as exc:
        probe = subprocess.CompletedProcess([], 127, "", str(exc))
    finally:
        os.rmdir(where)
    if probe.returncode:
        ap.error(f"disk_full needs a mount namespace of its own (unshare {' '.join(flags)}: "
                 f"{probe.stderr.strip() or probe.returncode}); leave it out of --kills")
    env = {**os.environ, NAMESPACE_ENV: "1"}
    return subprocess.run(["unshare", *flags, sys.executable, *sys.argv], env=env).returncode


def account(args, records: str, faults_log: str, kills, hung: bool, wall: float) -> dict:
    model, inputs = zoo.load(args.model)
    tasks = extract_tasks(model, inputs)[:args.tasks]
    keys = {t.key: t for t in tasks}
    recs = [r for r in load_records(records).records if r.task_key in keys]
    seen = collections.Counter((r.task_key, r.config_key()) for r in recs)
    injected = collections.Counter()
    faulty = set()
    if os.path.exists(faults_log):
        for line in open(faults_log):
            entry = json.loads(line)
            injected[entry["kind"]] += 1
            faulty.add(json.dumps(entry["config"], sort_keys=True))
    best = best_per_task(recs)
    chosen = [(keys[k].compute, Config.from_json(r.config)) for k, r in best.items()]
    verdicts = check_isolated(chosen, None, 1)
    wrong = sum(v is not None for v in verdicts) + \
        sum(r.config_key() in faulty for r in best.values())
    report = {"model": args.model, "tasks": len(tasks), "trials_requested": args.trials,
              "trials_recorded": len(recs),
              "duplicates": sum(n - 1 for n in seen.values() if n > 1),
              "lost": max(0, args.trials - len(recs)), "hung": hung,
              "faults_injected": {**dict(kills), **dict(injected)},
              "errors": dict(collections.Counter(r.error_kind for r in recs if r.error_kind)),
              "tasks_with_a_kernel": len(best), "wrong_kernels_chosen": wrong,
              "wall_s": round(wall, 1), "cpu": cpu_info().name}
    report["ok"] = (not hung and report["lost"] == 0 and report["duplicates"] == 0
                    and wrong == 0)
    return report


if __name__ == "__main__":
    sys.exit(main())
