"""bench/tables.py: the results tables come from the committed JSON, one row per run, and the
committed bench/results/TABLE.md is what the script writes today."""
import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def _tables():
    spec = importlib.util.spec_from_file_location("bench_tables", ROOT / "bench" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


tables = _tables()


def _rows(results: pathlib.Path, dates: dict[str, str]) -> dict[str, dict[str, str]]:
    runs, _ = tables.read_runs(results, dates)
    by_title, _ = tables.tables(runs)
    return {row["file"]: row for rows in by_title.values() for row in rows}


def _full_history() -> bool:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == "false"


def test_a_network_run_becomes_one_row_with_every_column():
    name = "znver5/network_resnet18_2threads_800_stop33.json"
    row = _rows(RESULTS, {name: "2026-11-25"})[name]
    assert row == {"date": "2026-11-25", "CPU or GPU": "znver5", "threads": "2",
                   "command": "bench/network.py resnet18 --trials 800 --threads 2 --rounds 15",
                   "ours (ms)": "6.504", "best other (ms)": "OpenVINO 8.625", "ratio": "1.33x",
                   "file": name}


def test_a_gpu_run_names_its_target_and_no_threads():
    name = "h100-80gb-hbm3/network_resnet18_cuda_400trials.json"
    row = _rows(RESULTS, {})[name]
    assert row["command"] == "bench/network.py resnet18 --target cuda --trials 400"
    assert (row["threads"], row["best other (ms)"], row["ratio"]) == (
        "-", "torch.compile 1.295", "1.73x")


def test_a_gpu_run_in_a_precision_reads_each_variants_milliseconds():
    data = {"torch_ms": {"eager fp16": {"precision": "fp16", "ms": 0.41},
                         "compile reduce-overhead tf32": {"precision": "tf32", "ms": 0.31}}}
    assert tables.best_other(data) == ("compile reduce-overhead tf32", 0.31)


def test_a_deployment_run_names_its_load_time_and_the_backend_ratio():
    name = "znver5/deploy_resnet18_2threads.json"
    row = _rows(RESULTS, {name: "2026-11-26"})[name]
    assert (row["command"], row["load (s)"], row["threads"]) == (
        "bench/deploy.py resnet18 --threads 2", "0.73", "2")
    assert row["backend / ours"].startswith("1.117 (")


def test_a_record_set_comparison_names_both_sides_and_their_algorithms():
    name = "znver5/records_ab_resnet18_2threads_800_vs_1400.json"
    row = _rows(RESULTS, {name: "2026-11-26"})[name]
    assert row["command"] == (
        "bench/records_ab.py resnet18 --a 306fcc5:bench/results/znver5/network_resnet18_"
        "2threads.jsonl --b bench/results/znver5/network_resnet18_2threads.jsonl --threads 2 "
        "--rounds 15")
    assert (row["a (ms)"], row["b (ms)"], row["a / b"]) == ("6.398", "6.064",
                                                          "1.053 (0.996-1.080)")
    assert (row["a's convs"], row["b's convs"]) == ("direct 10, winograd 3, winograd4 7",
                                                    "direct 7, winograd 6, winograd4 7")


def test_a_json_file_without_json_is_counted_and_its_log_read_instead():
    runs, unreadable = tables.read_runs(RESULTS, {})
    assert "znver3/network_resnet18_2threads_800_stop31.json" in unreadable
    assert "znver3/network_resnet18_2threads_800_stop31.txt" in {r.path for r in runs}
    assert "no JSON object" in tables.render(RESULTS, {})


def test_the_date_comes_from_the_json_then_the_file_name_then_git(tmp_path):
    machine = tmp_path / "cpu0"
    machine.mkdir()
    run = {"model": "m", "threads": 1, "trials": 8, "ours_ms": 2.0,
           "torch_ms": {"eager": 3.0, "compile": None}}
    (machine / "network_a.json").write_text(json.dumps({**run, "date": "2026-01-02"}))
    (machine / "network_b_2026-03-04.json").write_text(json.dumps(run))
    (machine / "network_c.json").write_text(json.dumps(run))
    (machine / "network_d.txt").write_text("log\n" + json.dumps(run) + "\nEXIT 0\n")
    (machine / "notes.txt").write_text("no JSON here\n")
    rows = _rows(tmp_path, {"cpu0/network_c.json": "2026-05-06"})
    assert [rows[f"cpu0/network_{n}"]["date"] for n in ("a.json", "b_2026-03-04.json",
                                                        "c.json", "d.txt")] == [
        "2026-01-02", "2026-03-04", "2026-05-06", ""]
    assert rows["cpu0/network_a.json"]["best other (ms)"] == "PyTorch eager 3.000"
    assert rows["cpu0/network_a.json"]["ratio"] == "1.50x"
    assert len(rows) == 4


def test_check_fails_on_a_stale_table_and_passes_once_written(tmp_path):
    shutil.copytree(RESULTS / "h100-80gb-hbm3", tmp_path / "h100-80gb-hbm3")
    (tmp_path / "TABLE.md").write_text("stale\n")
    assert tables.main(["--results", str(tmp_path), "--check"]) == 1
    assert tables.main(["--results", str(tmp_path)]) == 0
    assert tables.main(["--results", str(tmp_path), "--check"]) == 0
    assert (tmp_path / "TABLE.md").read_text().startswith(tables.HEADER)


@pytest.mark.skipif(not _full_history(), reason="dates come from git: needs a full clone")
def test_the_committed_table_is_current():
    assert (RESULTS / "TABLE.md").read_text() == tables.render(RESULTS), (
        "bench/results/TABLE.md is stale: run python bench/tables.py")


def test_an_estimate_run_names_its_model_correlation_and_streams():
    """A run from before --model timed ResNet-18 and its machine model had no streams."""
    older = "rocketlake/estimate_resnet18_cold_40configs.json"
    newer = "rocketlake/estimate_mobilenet_v2_cold_40configs_streams.json"
    rows = _rows(RESULTS, {older: "2026-11-27", newer: "2026-11-27"})
    assert (rows[older]["command"], rows[older]["streams kept"]) == (
        "bench/estimate.py --configs 40 --cold", "")
    assert rows[older]["mean rank corr"] == "0.389"
    assert rows[newer]["command"] == \
        "bench/estimate.py --configs 40 --cold --model mobilenet_v2"
    assert (rows[newer]["threads"], rows[newer]["streams kept"]) == ("1", "28")


def test_a_settling_run_names_both_protocols_and_the_machines_drift():
    name = "rocketlake/settle_resnet18_2threads.json"
    row = _rows(RESULTS, {name: "2026-11-28"})[name]
    assert row["command"] == "bench/settle.py --model resnet18 --threads 2 --times 4"
    assert row["candidates"] == "114"
    assert row["settled"].startswith("0.2% disturbed; apart 1.30x (p90 1.63x)")
    assert row["plain"].startswith("2.4% disturbed; apart 1.32x (p90 1.60x)")
    assert row["rounds' pace"] == "1.02 0.90 1.03 1.02"
