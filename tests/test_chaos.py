"""bench/chaos.py, bounded: a short tuning run on a local Ray head, each process kill and
each kind of faulty candidate injected (hangs excepted: a hang costs the measurement
timeout, and tests/actors/test_pipeline.py covers it), and every trial accounted for."""
import json
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).parent.parent / "bench" / "chaos.py"


def test_a_short_chaos_run_loses_nothing_repeats_nothing_and_chooses_no_wrong_kernel():
    run = subprocess.run(
        [sys.executable, str(BENCH), "--tasks", "2", "--trials", "24", "--fault-every", "3",
         "--kills", "sigkill_measurer,driver_restart,sigkill_builder", "--in-turn",
         "--rates", "segfault=1,nan=1,wrong=1,every=3", "--deadline", "400"],
        capture_output=True, text=True, timeout=600)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["ok"], report
    assert report["trials_recorded"] == 24 and report["lost"] == 0
    assert report["duplicates"] == 0 and report["wrong_kernels_chosen"] == 0
    assert not report["hung"] and report["tasks_with_a_kernel"] == 2
    injected = report["faults_injected"]
    assert {"segfault", "nan", "wrong"} <= set(injected), injected
    assert injected.get("sigkill_measurer", 0) >= 1, injected
    assert {"crashed", "non_finite", "wrong_output"} <= set(report["errors"]), report
