"""bench/chaos.py, bounded: a short tuning run on a local Ray cluster (a head and two worker
nodes), each process kill, a node removed, a driver restart, a full temp directory (where
this machine lets a process mount one in a namespace of its own) and each kind of faulty
candidate injected (hangs excepted: a hang costs the measurement timeout, and
tests/actors/test_pipeline.py covers it), and every trial accounted for."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

BENCH = pathlib.Path(__file__).parent.parent / "bench" / "chaos.py"
# enough trials for the run to outlast every fault in turn: at 9 trials/s on 2 cores, a run
# of 40 was over before the kills that follow the full disk came
TRIALS = 160
KILLS = ["sigkill_measurer", "ray_kill_builder", "remove_node", "driver_restart",
         "sigkill_builder", "ray_kill_measurer"]


def private_mounts() -> bool:
    """Whether bench/chaos.py can mount its small temp filesystem (as its probe does)."""
    flags = ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]
    with tempfile.TemporaryDirectory() as where:
        try:
            probe = subprocess.run(["unshare", *flags, "mount", "-t", "tmpfs", "-o", "size=1m",
                                    "tmpfs", where], capture_output=True)
        except FileNotFoundError:
            return False
    return probe.returncode == 0


@pytest.mark.slow  # 378 s alone on 2 cores, a fifth of the default suite's time
def test_a_short_chaos_run_loses_nothing_repeats_nothing_and_chooses_no_wrong_kernel():
    kills = ["disk_full"] * private_mounts() + KILLS  # first: while builds go on for sure
    run = subprocess.run(
        [sys.executable, str(BENCH), "--tasks", "2", "--trials", str(TRIALS), "--fault-every", "1",
         "--full-s", "3", "--kills", ",".join(kills), "--in-turn",
         "--max-faults", str(len(kills)),  # each once: a loaded machine still progresses
         "--rates", "segfault=1,nan=1,wrong=1,every=4", "--deadline", "900"],
        capture_output=True, text=True, timeout=1200)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["ok"], report
    assert report["trials_recorded"] == TRIALS and report["lost"] == 0
    assert report["duplicates"] == 0 and report["wrong_kernels_chosen"] == 0
    assert not report["hung"] and report["tasks_with_a_kernel"] == 2
    injected = report["faults_injected"]
    assert set(kills) <= set(injected), injected  # each fault landed at least once
    assert {"segfault", "nan", "wrong"} <= set(injected), injected
    # a faulty build may be lost with its builder and built again for real; what is
    # measured is recorded as its error kind
    assert "crashed" in report["errors"], report
    assert {"non_finite", "wrong_output"} & set(report["errors"]), report
    if "disk_full" in kills:  # the full disk was met, and waited out
        assert report["host_fault_retries"] >= 1, report
