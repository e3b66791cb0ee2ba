"""Dashboard metrics (actors/metrics.py): what a round records, computed without Ray, and a
real tuning run whose `raytune_kernels_*` series are scraped from Ray's Prometheus endpoint.

The scrape runs in a subprocess: it needs a Ray of its own with a known metrics port and a
short report interval, apart from the session's local one. Ray exports metrics only from
its full install (ray[default]: the dashboard agent's reporter module serves the
endpoint, with include_dashboard=False too); with the minimal install that test skips.
"""
import importlib.util
import json
import socket
import subprocess
import sys

import pytest

from actors.metrics import COUNTERS, GAUGES, Reading, TrialRate, TuningMetrics, readings
from actors.pipeline import PipelineStats
from raytune_kernels.tune.records import Record
from raytune_kernels.tune.result import RoundSummary, TaskRow

INF = float("inf")


def _summary(trials=6, estimated=3e-3, latencies=(1e-3, INF), budget=12, elapsed=2.0):
    rows = tuple(TaskRow(i, f"k{i}", f"op{i}", 1, 3, s, 0.0 if s == INF else 5.0)
                 for i, s in enumerate(latencies))
    return RoundSummary(1, 0, rows, estimated, trials, budget, elapsed, 3, {})


def _record(key, error=None):
    return Record(key, "llvm", "cpu", {}, () if error else (1e-3,), error)


def _by_name(values):
    return {(r.name, r.tags): r.value for r in values}


def test_a_round_counts_trials_by_result_and_errors_by_kind():
    recs = [_record("k0"), _record("k0"), _record("k0", "build_error"),
            _record("k1", "timeout")]
    counts, _ = readings(_summary(), recs, 1.0, None, None)
    assert _by_name(counts) == {
        ("trials", (("task", "k0"), ("compute", "op0"), ("result", "ok"))): 2,
        ("trials", (("task", "k0"), ("compute", "op0"), ("result", "build_error"))): 1,
        ("trials", (("task", "k1"), ("compute", "op1"), ("result", "timeout"))): 1,
        ("errors", (("kind", "build_error"),)): 1, ("errors", (("kind", "timeout"),)): 1}


def test_gauges_leave_unknown_latencies_unset_and_add_the_pytorch_part():
    _, gauges = readings(_summary(), [], 2.5, None, None, torch_s=1e-3)
    values = _by_name(gauges)
    assert values[("best_latency_ms", (("task", "k0"), ("compute", "op0")))] == pytest.approx(1.0)
    assert values[("best_gflops", (("task", "k0"), ("compute", "op0")))] == 5.0
    assert not any(tags == (("task", "k1"), ("compute", "op1")) for _, tags in values)
    assert values[("estimated_latency_ms", ())] == pytest.approx(4.0)
    assert values[("trials_per_second", ())] == 2.5
    assert values[("budget_used_fraction", ())] == 0.5
    _, gauges = readings(_summary(estimated=INF), [], 0.0, None, None)
    assert ("estimated_latency_ms", ()) not in _by_name(gauges)


def test_pipeline_figures_are_taken_since_the_previous_round():
    before = PipelineStats(measure_busy_s=1.0, wall_s=2.0, measurers=2, redone=1)
    now = PipelineStats(measure_busy_s=4.0, wall_s=4.0, measurers=2, redone=3, build_timeouts=1)
    counts, gauges = readings(_summary(), [], 0.0, before, now)
    assert _by_name(counts) == {("redone", ()): 2, ("build_timeouts", ()): 1}
    values = _by_name(gauges)
    assert values[("measurer_busy_fraction", ())] == pytest.approx(0.75)  # 3 s of 2 x 2 s
    assert values[("measurers", ())] == 2
    _, gauges = readings(_summary(), [], 0.0, now, now)  # no batch ran: no new fraction
    assert ("measurer_busy_fraction", ()) not in _by_name(gauges)


def test_the_rate_looks_at_the_last_window_only():
    rate = TrialRate(window_s=10.0)
    assert rate.add(0.0, 0) == 0.0
    assert rate.add(5.0, 50) == 10.0
    assert rate.add(20.0, 80) == pytest.approx(30 / 15)  # from the last point before 10 s
    assert rate.add(40.0, 80) == 0.0  # a stall shows up as a stall, not as a run average


def test_tuning_metrics_record_each_round_once(monkeypatch):
    got = []
    monkeypatch.setattr("actors.metrics.record", lambda c, g: got.append((c, g)))
    metrics, stats = TuningMetrics(), PipelineStats(measurers=1)
    metrics.observe(_summary(trials=2, elapsed=0.0), [], stats)  # resumed: 2 trials
    stats.wall_s, stats.measure_busy_s = 2.0, 1.0
    metrics.observe(_summary(trials=6, elapsed=2.0), [_record("k0")] * 4, stats)
    counts, gauges = got[-1]
    assert sum(r.value for r in counts if r.name == "trials") == 4
    values = _by_name(gauges)
    assert values[("trials_per_second", ())] == 2.0  # 4 new trials in 2 s, resumed ones not
    assert values[("measurer_busy_fraction", ())] == 0.5
    assert metrics.stats is not stats  # a copy: the pipeline keeps adding to its own


def test_rounds_closer_than_the_interval_are_recorded_together(monkeypatch):
    got = []
    monkeypatch.setattr("actors.metrics.record", lambda c, g: got.append((c, g)))
    metrics, stats = TuningMetrics(every_s=1.0), PipelineStats(measurers=2)
    for i in range(10):  # ten rounds of 2 trials in 0.5 s
        stats.wall_s, stats.measure_busy_s = 0.05 * (i + 1), 0.08 * (i + 1)
        metrics.observe(_summary(trials=2 * (i + 1), elapsed=0.05 * (i + 1), budget=100),
                        [_record("k0"), _record("k1", "timeout")], stats)
    assert len(got) == 1  # the first round; the others wait for the interval
    metrics.flush()
    assert len(got) == 2
    counts = _by_name(got[1][0])
    assert sum(v for (name, _), v in counts.items() if name == "trials") == 18
    assert counts[("errors", (("kind", "timeout"),))] == 9
    assert _by_name(got[1][1])[("measurer_busy_fraction", ())] == pytest.approx(0.8)
    metrics.flush()
    assert len(got) == 2  # nothing held back: nothing recorded


def test_the_round_that_spends_the_budget_is_recorded_at_once(monkeypatch):
    """The run's last round is not held back for an interval no later round would end:
    its figures reach the endpoint while the scheduler actor still reports."""
    got = []
    monkeypatch.setattr("actors.metrics.record", lambda c, g: got.append((c, g)))
    metrics = TuningMetrics(every_s=1.0)
    metrics.observe(_summary(trials=2, budget=4, elapsed=0.1), [_record("k0")] * 2)
    metrics.observe(_summary(trials=3, budget=4, elapsed=0.2), [_record("k0")])
    assert len(got) == 1  # held back
    metrics.observe(_summary(trials=4, budget=4, elapsed=0.3), [_record("k1")])
    assert len(got) == 2
    assert sum(r.value for r in got[1][0] if r.name == "trials") == 2


def test_a_failure_to_record_never_stops_tuning(monkeypatch, capsys):
    def broken(counts, gauges):
        raise RuntimeError("no agent")
    monkeypatch.setattr("actors.metrics.record", broken)
    metrics = TuningMetrics()
    metrics.observe(_summary(), [_record("k0")])
    metrics.observe(_summary(), [_record("k0")])  # tried once, then left alone
    assert metrics.failed and capsys.readouterr().err.count("recording stopped") == 1


def test_every_metric_name_is_valid_for_prometheus():
    names = list(COUNTERS) + list(GAUGES)
    assert all(n.replace("_", "").isalnum() and n.islower() for n in names)
    assert Reading("trials", 1.0).tags == ()


SCRIPT = '''
import json, os, re, sys, time, urllib.request
os.environ["RAY_metrics_report_interval_ms"] = "500"  # Ray's default is 10 s
import torch, ray
import raytune_kernels as rk

port, trials = int(sys.argv[1]), 8
SERIES = re.compile(r'^ray_(raytune_kernels_\\w+)(?:\\{(.*)\\})? (\\S+)$')

def scrape():
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    out = []
    for line in body.decode().splitlines():
        m = SERIES.match(line)
        if m:
            labels = dict(re.findall(r'(\\w+)="((?:[^"\\\\]|\\\\.)*)"', m.group(2) or ""))
            out.append([m.group(1), labels, float(m.group(3))])
    return out

def counted(series):
    return sum(v for n, _, v in series if n == "raytune_kernels_trials_total")

class Scrape(rk.Callback):
    """At the last round, while the scheduler actor is alive and reporting: scrape until
    the endpoint has every trial (the agent exports every report interval)."""
    series, rounds = [], 0
    def on_round(self, summary):
        Scrape.rounds += 1
        if summary.trials < trials:
            return
        end = time.time() + 60
        while time.time() < end and counted(Scrape.series) < trials:
            time.sleep(0.25)
            Scrape.series = scrape()

ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
         configure_logging=False, _metrics_export_port=port)
model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(16 * 6 * 6, 8)).eval()
x = torch.randn(1, 8, 6, 6)
res = rk.tune_network(model, (x,), trials=trials, batch=2, verbose=False,
                      callbacks=[Scrape()])
print("RESULT " + json.dumps({"series": Scrape.series, "trials": res.trials,
                              "rounds": Scrape.rounds,
                              "best_ms": {k: r.median * 1e3 for k, r in res.best.items()},
                              "estimated_ms": res.estimated_latency_s * 1e3}), flush=True)
ray.shutdown()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exports_metrics() -> str | None:
    """Why this Ray exports no metrics (its minimal install), or None."""
    try:  # what Ray itself decides by when it starts the agent --minimal
        from ray._private.utils import get_dashboard_dependency_error
        err = get_dashboard_dependency_error()
    except ImportError:  # moved in a later Ray: ask for the agent's main dependency
        err = None if importlib.util.find_spec("aiohttp") else "no aiohttp"
    return f"Ray's metrics agent needs ray[default] ({err})" if err else None


@pytest.fixture(scope="module")
def scraped():
    reason = _exports_metrics()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(_free_port())],
                          capture_output=True, text=True, timeout=180)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def _values(run, name):
    return [(labels, v) for n, labels, v in run["series"] if n == "raytune_kernels_" + name]


@pytest.mark.e2e
def test_the_trials_counter_counts_every_trial_by_task(scraped):
    trials = _values(scraped, "trials_total")
    assert sum(v for _, v in trials) == scraped["trials"] == 8
    assert {lb["task"] for lb, _ in trials} == set(scraped["best_ms"])
    assert {lb["result"] for lb, _ in trials} <= {"ok", "build_error", "runtime_error",
                                                   "wrong_output", "non_finite", "timeout",
                                                   "crashed", "host_error"}
    assert all(lb["compute"] for lb, _ in trials)
    errors = sum(v for lb, v in trials if lb["result"] != "ok")
    assert sum(v for _, v in _values(scraped, "errors_total")) == errors


@pytest.mark.e2e
def test_best_latency_per_task_and_the_estimate_match_the_result(scraped):
    best = {lb["task"]: v for lb, v in _values(scraped, "best_latency_ms")}
    assert best.keys() == scraped["best_ms"].keys()
    for key, ms in scraped["best_ms"].items():
        assert 0 < best[key] == pytest.approx(ms)
    [(_, estimate)] = _values(scraped, "estimated_latency_ms")
    assert 0 < estimate == pytest.approx(scraped["estimated_ms"])
    assert all(v > 0 for _, v in _values(scraped, "best_gflops"))


@pytest.mark.e2e
def test_throughput_and_measurer_gauges_are_sane(scraped):
    [(_, rate)] = _values(scraped, "trials_per_second")
    [(_, busy)] = _values(scraped, "measurer_busy_fraction")
    [(_, measurers)] = _values(scraped, "measurers")
    [(_, used)] = _values(scraped, "budget_used_fraction")
    assert 0 < rate < 1000 and 0 < busy <= 1 and measurers == 1 and used == 1.0
