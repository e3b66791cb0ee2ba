import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from raytune_kernels.tune.records import (MalformedRecord, Record, RecordWriter, best_per_task,
                                          describe_devices, distill, load_records,
                                          measured_on, other_devices, top_k)


def rec(key="k1", t=1.0, error=None, cfg=None):
    return Record(key, "llvm", "znver5", cfg or {"tile": t}, () if error else (t, t, t),
                  error_kind=error, error_msg="boom" if error else "")


def test_round_trip_and_best(tmp_path):
    path = str(tmp_path / "r.jsonl")
    batch = [rec("a", 3.0), rec("a", 1.0), rec("a", error="crashed"), rec("b", 2.0)]
    with RecordWriter(path) as w:
        w.write_batch(batch)
    loaded = load_records(path)
    assert loaded.records == batch and loaded.skipped == 0
    best = best_per_task(loaded.records)
    assert best["a"].median == 1.0 and best["b"].median == 2.0
    assert [r.median for r in top_k(loaded.records, "a", 5)] == [1.0, 3.0]


def test_threads_round_trip_and_default_for_older_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    old = rec("a", 2.0).to_json()
    del old["threads"]  # written before records said how many threads ran
    two = {**rec("a", 1.0).to_json(), "threads": 2}
    path.write_text(json.dumps(old) + "\n" + json.dumps(two) + "\n"
                    + json.dumps({**two, "threads": 0}) + "\n")
    with pytest.warns(UserWarning, match="threads must be a positive integer"):
        loaded = load_records(str(path)).records
    assert [r.threads for r in loaded] == [1, 2]
    assert best_per_task(loaded, threads=1)["a"].median == 2.0
    assert best_per_task(loaded, threads=2)["a"].median == 1.0


def test_malformed_lines_are_counted_skipped_and_warned(tmp_path):
    path = tmp_path / "r.jsonl"
    good = json.dumps(rec().to_json())
    path.write_text("\n".join([good, "{not json", json.dumps({"task_key": 1}), "[]",
                               json.dumps({**rec().to_json(), "times": ["x"]}), good]) + "\n")
    with pytest.warns(UserWarning, match="skipped 4 malformed record line"):
        loaded = load_records(str(path))
    assert len(loaded.records) == 2 and loaded.skipped == 4


def test_loading_never_executes_anything(tmp_path):
    path = tmp_path / "r.jsonl"
    marker = tmp_path / "pwned"
    evil = {**rec().to_json(), "config": {"__reduce__": f"open('{marker}', 'w')"}}
    path.write_text(json.dumps(evil) + "\n")
    loaded = load_records(str(path))
    assert loaded.records[0].config == evil["config"] and not marker.exists()
    with pytest.raises(MalformedRecord, match="missing field 'target'"):
        Record.from_json({"task_key": "a"})


def test_a_killed_writer_loses_at_most_the_batch_in_flight(tmp_path):
    path = str(tmp_path / "r.jsonl")
    script = textwrap.dedent(f"""
        import os, signal
        from raytune_kernels.tune.records import Record, RecordWriter
        w = RecordWriter({path!r})
        for b in range(3):
            w.write_batch([Record("k", "llvm", "cpu", {{"b": b, "i": i}}, (1.0,)) for i in range(4)])
        w._f.write('{{"task_key": "k", "target": "ll')  # the batch in flight, half written
        w._f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with pytest.warns(UserWarning, match="skipped 1"):
        loaded = load_records(path)
    assert len(loaded.records) == 12
    with RecordWriter(path) as w:  # appending after the torn line still works
        w.write_batch([rec("later")])
    with pytest.warns(UserWarning):
        assert load_records(path).records[-1].task_key == "later"


def test_a_file_gets_every_batch_at_once_and_an_fsync_at_most_once_per_interval(
        tmp_path, monkeypatch):
    path, synced = str(tmp_path / "r.jsonl"), []
    monkeypatch.setattr("raytune_kernels.tune.records.os.fsync", synced.append)
    w = RecordWriter(path, sync_s=3600)
    for b in range(20):
        w.write_batch([rec("k", 1.0 + b)])
        assert len(load_records(path).records) == b + 1  # readable at once: a killed
    assert len(synced) == 1  # process loses nothing; only the first batch was fsynced
    w.close()
    assert len(synced) == 2  # and the rest on close
    with RecordWriter(path, sync_s=0) as w:
        for b in range(3):
            w.write_batch([rec("k", 1.0 + b)])
    assert len(synced) == 5  # sync_s=0: every batch


def test_distill_keeps_the_best_per_task(tmp_path):
    src, dst = str(tmp_path / "all.jsonl"), str(tmp_path / "best.jsonl")
    with RecordWriter(src) as w:
        w.write_batch([rec("a", 3.0), rec("a", 1.0), rec("b", error="timeout"), rec("c", 5.0)])
    assert distill(src, dst) == 2
    assert {(r.task_key, r.median) for r in load_records(dst)} == {("a", 1.0), ("c", 5.0)}


def test_distill_writes_through_a_temp_file_of_its_own(tmp_path):
    """A file named dst.tmp (another writer's, say) is neither used nor removed, and no
    temp file is left behind."""
    src, dst = str(tmp_path / "all.jsonl"), str(tmp_path / "best.jsonl")
    with RecordWriter(src) as w:
        w.write_batch([rec("a", 3.0), rec("a", 1.0)])
    (tmp_path / "best.jsonl.tmp").write_text("someone else's\n")
    assert distill(src, dst) == 1
    assert (tmp_path / "best.jsonl.tmp").read_text() == "someone else's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.jsonl", "best.jsonl",
                                                          "best.jsonl.tmp"]


def test_distill_keeps_the_best_of_each_layout_and_thread_count(tmp_path):
    """compile_network weighs each layout's best record and reads one thread count:
    distilling must not drop them."""
    src, dst = str(tmp_path / "all.jsonl"), str(tmp_path / "best.jsonl")
    recs = [rec("a", 1.0, cfg={"layout": "NHWC", "bm": 16}),
            rec("a", 2.0, cfg={"layout": "NHWC", "bm": 32}),
            rec("a", 3.0, cfg={"layout": "NCHW", "bm": 16}),
            rec("b", 1.0, cfg={"cb": 16, "ob": 16, "tile_w": 4}),
            rec("b", 2.0, cfg={"cb": 16, "ob": 16, "tile_w": 8}),
            rec("b", 4.0, cfg={"cb": 1, "ob": 16, "tile_w": 4})]
    recs.append(dataclasses.replace(recs[1], threads=2))
    with RecordWriter(src) as w:
        w.write_batch(recs)
    assert distill(src, dst) == 5
    kept = {(r.task_key, r.median, r.threads) for r in load_records(dst)}
    assert kept == {("a", 1.0, 1), ("a", 3.0, 1), ("a", 2.0, 2), ("b", 1.0, 1), ("b", 4.0, 1)}


def test_layout_knobs_decide_the_layouts_a_config_reads_and_writes(zoo_models):
    """Configs that agree on LAYOUT_KNOBS read and write the same layouts, on the CPU and
    on the GPU: distilling by them keeps every candidate the layout ILP would see."""
    import random

    import raytune_kernels as rk
    from raytune_kernels.cpu.machine import cpu_info
    from raytune_kernels.cuda.render import cuda_layouts, cuda_space_for
    from raytune_kernels.cpu.schedules import space_for
    from raytune_kernels.layout.costs import layouts_of
    from raytune_kernels.tune.records import distill_key

    model, inputs = zoo_models["mobilenet_v2"]  # conv, depthwise, pooling, dense
    rng, cpu, several = random.Random(0), cpu_info(), 0
    for task in rk.extract_tasks(model, inputs)[:12]:
        for space, layouts in ((space_for(task.compute, cpu), lambda c: layouts_of(task, c)),
                               (cuda_space_for(task.compute),
                                lambda c: cuda_layouts(task.compute, c))):
            seen: dict[tuple, tuple] = {}
            for _ in range(40):
                cfg = space.sample(rng)
                key = distill_key(Record(task.key, "t", "d", cfg.to_json(), (1.0,)))
                assert seen.setdefault(key, layouts(cfg)) == layouts(cfg), \
                    (task.compute.describe(), cfg)
            several += len(set(seen.values())) > 1
    assert several >= 12  # most tasks have configs in several layouts on each target


def test_unwritable_path_fails_early(tmp_path):
    with pytest.raises(OSError, match="cannot write records"):
        RecordWriter(str(tmp_path / "no" / "such" / "dir.jsonl"))
    assert os.path.exists(tmp_path)


def test_records_from_measured_results(tmp_path):
    import random

    import torch

    import raytune_kernels as rk
    from raytune_kernels.cpu.machine import CpuInfo, assumed_model
    from raytune_kernels.cpu.schedules import space_for
    from tests.support.fake import FakeMeasurer
    from raytune_kernels.tune.records import record_of
    task = rk.extract_tasks(torch.nn.Linear(32, 16), (torch.randn(8, 32),))[0]
    space = space_for(task.compute, CpuInfo("test", (8,), 16, assumed_model("test", (8,))))
    rng, fake = random.Random(0), FakeMeasurer()
    cfgs = [space.sample(rng) for _ in range(5)]
    path = str(tmp_path / "r.jsonl")
    with RecordWriter(path) as w:
        w.write_batch([record_of(task.key, "llvm", "test", c.to_json(), fake.measure(task, c))
                       for c in cfgs])
    loaded = load_records(path).records
    assert [r.config for r in loaded] == [c.to_json() for c in cfgs]
    assert loaded[0].versions["torch"] == torch.__version__ and loaded[0].schema == 1
    best = min(cfgs, key=lambda c: fake.measure(task, c).median)
    assert best_per_task(loaded)[task.key].config == best.to_json()


def test_records_name_the_measuring_device_and_its_instruction_sets(tmp_path):
    avx512 = dataclasses.replace(rec("a", 1.0), isa="avx2,fma,avx512f")
    old = rec("a", 2.0)  # written before records named the ISA: matched by name alone
    masked = dataclasses.replace(rec("a", 3.0), isa="avx2,fma")  # a VM hiding AVX-512
    other = dataclasses.replace(rec("a", 4.0), device="znver3", isa="avx2,fma")
    path = str(tmp_path / "r.jsonl")
    with RecordWriter(path) as w:
        w.write_batch([avx512, old, masked, other])
    loaded = load_records(path).records
    assert loaded == [avx512, old, masked, other] and "isa" not in old.to_json()
    here = ("znver5", "avx2,fma,avx512f")
    assert [measured_on(r, *here) for r in loaded] == [True, True, False, False]
    counts = other_devices(loaded, *here)
    assert counts == {"znver5 [avx2,fma]": 1, "znver3": 1}
    assert describe_devices({"znver3": 5, "znver4": 9}) == "9 of znver4, 5 of znver3"
    (tmp_path / "bad.jsonl").write_text(json.dumps({**avx512.to_json(), "isa": 3}) + "\n")
    with pytest.warns(UserWarning, match="isa must be a string"):
        assert load_records(str(tmp_path / "bad.jsonl")).records == []


def test_a_deeply_nested_line_is_a_malformed_line_not_a_recursion_error(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec("a", 1.0).to_json()) + "\n" + "[" * 100_000 + "]" * 100_000
                    + "\n" + json.dumps(rec("b", 2.0).to_json()) + "\n")
    with pytest.warns(UserWarning, match="skipped 1 malformed record line.*line 2"):
        loaded = load_records(str(path))
    assert [r.task_key for r in loaded.records] == ["a", "b"] and loaded.skipped == 1
