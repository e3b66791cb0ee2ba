"""Chaos benchmark: a tuning run with faults injected at random moments, then an account
of every trial.

    python bench/chaos.py [--model resnet18] [--tasks 6] [--trials 300] [--fault-every 6]

A local Ray head is started for the run (its own temp dir, 2 CPUs); the driver runs
tune_tasks on the model's first `--tasks` tasks in a child process, against that head,
with records in a temp dir. While it runs, at exponentially distributed moments (mean
`--fault-every` seconds), one of:

- sigkill_builder / sigkill_measurer: SIGKILL of a builder's or measurer's worker process
  (found by the title Ray gives it, ray::BuilderActor / ray::MeasurerActor);
- driver_restart: SIGKILL of the driver, then a new driver that resumes the records.

and, inside the builders (RAYTUNE_KERNELS_CHAOS, raytune_kernels/cpu/faults.py), candidates
replaced by kernels that segfault, hang, write NaN or write nothing, at `--rates`.

Then: trials_recorded (records of those tasks), duplicates (a task and config recorded
twice), lost (requested trials never recorded), hung (the run passed --deadline),
wrong_kernels_chosen (each task's best record rebuilt and checked against its reference in
a child process; an injected fault chosen counts too), the faults injected by kind, and
the records' error kinds. Last line: one JSON object. Not injected here: node removal
(tests/actors/test_cluster.py removes nodes) and a full temp directory.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import secrets
import signal
import socket
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

DRIVER = """
import sys
import raytune_kernels as rk
from raytune_kernels import zoo
model, inputs = zoo.load(sys.argv[1])
tasks = rk.extract_tasks(model, inputs)[:int(sys.argv[2])]
rk.tune_tasks(tasks, trials=int(sys.argv[3]), records=sys.argv[4], address=sys.argv[5],
              verbose=False, batch=8)
"""
KILLS = ("sigkill_builder", "sigkill_measurer", "driver_restart")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    ap.add_argument("--fault-every", type=float, default=6.0, help="mean seconds between "
                    "process kills")
    ap.add_argument("--rates", default="segfault=0.02,hang=0.004,nan=0.02,wrong=0.02",
                    help="candidate faults injected by the builders (per candidate)")
    ap.add_argument("--deadline", type=float, default=1800.0, help="seconds before the run "
                    "counts as hung")
    ap.add_argument("--kills", default=",".join(KILLS), help="process kills to inject, "
                    "comma-separated; with --in-turn they come in this order, else at random")
    ap.add_argument("--in-turn", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (records, log)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    kinds = [k for k in args.kills.split(",") if k]
    if not kinds or set(kinds) - set(KILLS):
        ap.error(f"--kills takes some of {', '.join(KILLS)}")
    work = tempfile.mkdtemp(prefix="rk_chaos_")
    ray_tmp = tempfile.mkdtemp(prefix="rkc_", dir="/tmp")  # short: Ray's socket paths
    records, faults_log = os.path.join(work, "records.jsonl"), os.path.join(work, "faults")
    token = os.path.join(work, "auth_token")  # this run's Ray token, for every process
    with open(token, "w") as f:
        f.write(secrets.token_hex(32))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token)
    env = {**os.environ, CHAOS_ENV: f"{args.rates},log={faults_log}"}
    port = free_port()
    address = f"127.0.0.1:{port}"
    start = time.perf_counter()
    kills: collections.Counter = collections.Counter()
    hung = False
    try:
        subprocess.run(["ray", "start", "--head", f"--port={port}", "--num-cpus=2",
                        f"--temp-dir={ray_tmp}", "--disable-usage-stats"], env=env,
                       check=True, capture_output=True)
        while True:
            driver = subprocess.Popen([sys.executable, "-c", DRIVER, args.model,
                                       str(args.tasks), str(args.trials), records, address],
                                      env=env, stdout=subprocess.DEVNULL,
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
                kind = kinds[sum(kills.values()) % len(kinds)] if args.in_turn else \
                    rng.choice(kinds)
                if kind == "driver_restart":
                    driver.kill()
                    driver.wait()
                    kills[kind] += 1
                    restarted = True
                    break
                pids = actor_pids("BuilderActor" if kind == "sigkill_builder"
                                  else "MeasurerActor")
                if pids:
                    try:
                        os.kill(rng.choice(pids), signal.SIGKILL)
                        kills[kind] += 1
                    except ProcessLookupError:
                        pass
            if hung or (not restarted and driver.returncode == 0):
                break
            if not restarted:  # the driver failed by itself: that is a finding, not a fault
                print(f"driver exited with status {driver.returncode}; see "
                      f"{os.path.join(work, 'driver.log')}", file=sys.stderr)
                hung = True
                break
        wall = time.perf_counter() - start
        report = account(args, records, faults_log, kills, hung, wall)
    finally:
        kill_tree_of(ray_tmp)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


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
