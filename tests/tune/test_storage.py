"""Record stores (tune/storage.py) and the records read and written through them: on the
local disk (a directory, file://), two writers at once, malformed lines in a batch, distill
between files and stores, and on S3 (moto's server, reached through pyarrow)."""
import json
import os
import re
import sys
import threading

import pytest

from raytune_kernels.tune.records import (Record, RecordWriter, distill, load_records,
                                          missing_records)
from raytune_kernels.tune.storage import StorageError, is_store, open_store, redact
from tests.support.s3 import moto_server, new_bucket, s3_uri

BATCH = re.compile(r"^\d{20}-[0-9a-f]{32}\.jsonl$")


def rec(key="k", t=1.0, i=0):
    return Record(key, "llvm", "znver5", {"t": t, "i": i}, (t, t))


@pytest.fixture(scope="module")
def s3_endpoint():
    pytest.importorskip("pyarrow")
    pytest.importorskip("moto.server")
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_store(s3_endpoint):
    """A record store URI on a new, empty bucket."""
    return s3_uri(s3_endpoint, new_bucket(s3_endpoint))


def test_which_locations_are_stores(tmp_path):
    (tmp_path / "d").mkdir()
    assert not is_store(str(tmp_path / "r.jsonl")) and not is_store(str(tmp_path / "new"))
    assert is_store(str(tmp_path / "d")) and is_store(str(tmp_path / "new") + "/")
    assert is_store("file:///tmp/x.jsonl") and is_store("s3://bucket/prefix")
    assert redact("s3://key:secret@b/p?x=1") == "s3://key:***@b/p?x=1"
    assert redact("s3://b/p") == "s3://b/p"


def test_a_directory_and_its_file_uri_are_one_store(tmp_path):
    store = str(tmp_path / "runs") + "/"
    assert missing_records(store) == f"record store {store!r} does not exist or holds no batch"
    with RecordWriter(store) as w:  # the directory is made by the writer, before any batch
        assert os.listdir(store) == []
        w.write_batch([rec("a", 2.0), rec("b", 3.0)])
        w.write_batch([])  # no empty batch is written
        w.write_batch([rec("a", 1.0)])
    names = sorted(os.listdir(store))
    assert len(names) == 2 and all(BATCH.match(n) for n in names)  # no temp file left
    loaded = load_records(f"file://{tmp_path}/runs")
    assert [(r.task_key, r.median) for r in loaded] == [("a", 2.0), ("b", 3.0), ("a", 1.0)]
    assert load_records(store).records == loaded.records and missing_records(store) is None
    assert load_records(str(tmp_path / "nothing") + "/").records == []


def _write_concurrently(location: str, writers: int = 2, batches: int = 15) -> None:
    def write(w: int) -> None:
        with RecordWriter(location, sync_s=0) as out:  # one object per batch
            for b in range(batches):
                out.write_batch([rec(f"w{w}", 1.0 + b, i) for i in range(3)])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _check_two_writers(location: str) -> None:
    loaded = load_records(location)
    assert len(open_store(location).batches()) == 30 and len(loaded.records) == 90
    for w in ("w0", "w1"):  # every batch of each writer, each writer's in its own order
        mine = [(r.median, r.config["i"]) for r in loaded if r.task_key == w]
        assert mine == [(1.0 + b, i) for b in range(15) for i in range(3)]


def test_two_writers_into_one_store_lose_nothing(tmp_path):
    _write_concurrently(str(tmp_path / "store") + "/")
    _check_two_writers(str(tmp_path / "store"))


def test_malformed_lines_of_a_batch_are_skipped_naming_batch_and_line(tmp_path):
    store = str(tmp_path)
    with RecordWriter(store) as w:
        w.write_batch([rec("a")])
    bad = "99999999999999999999-" + "f" * 32 + ".jsonl"  # read last: names sort by time
    good = Record("b", "llvm", "znver5", {}, (1.0,)).to_json()
    (tmp_path / bad).write_text(f'{{"task_key": "b", "ta\n{json.dumps(good)}\n')
    (tmp_path / ".half-written.jsonl.tmp").write_text("{")  # a temp name is no batch
    (tmp_path / "notes.txt").write_text("not records")
    with pytest.warns(UserWarning, match=rf"{re.escape(store)}: skipped 1 malformed record "
                                         rf"line\(s\), first at batch {bad} line 1: "):
        loaded = load_records(store)
    assert [r.task_key for r in loaded] == ["a", "b"] and loaded.skipped == 1


def test_distill_between_files_and_stores(tmp_path):
    src = str(tmp_path / "all.jsonl")
    with RecordWriter(src) as w:
        w.write_batch([rec("a", 3.0), rec("a", 1.0, 1), rec("c", 5.0)])
    best = {("a", 1.0), ("c", 5.0)}
    store = str(tmp_path / "best") + "/"
    assert distill(src, store) == 2  # file -> store: one batch
    assert {(r.task_key, r.median) for r in load_records(store)} == best
    assert len(open_store(store).batches()) == 1
    assert distill(f"file://{tmp_path}/best", str(tmp_path / "best.jsonl")) == 2
    assert {(r.task_key, r.median) for r in load_records(str(tmp_path / "best.jsonl"))} == best
    assert sorted(os.listdir(tmp_path)) == ["all.jsonl", "best", "best.jsonl"]  # no temp
    assert distill(store, f"file://{tmp_path}/again") == 2  # store -> store
    with pytest.raises(StorageError, match="cannot distill into record store .*best/'"
                                           ": it already holds 1 batch"):
        distill(src, store)  # a store's batches are never replaced
    assert len(open_store(store).batches()) == 1


def test_the_distill_command_reads_and_writes_stores(tmp_path, capsys):
    from raytune_kernels.cli import main

    store = f"file://{tmp_path}/all"
    with RecordWriter(store) as w:
        w.write_batch([rec("a", float(i + 1), i) for i in range(4)])
    assert main(["distill", store, "-o", str(tmp_path / "best"), "--top", "2"]) == 0
    assert "kept 2 record(s) (2 in" in capsys.readouterr().out
    assert main(["distill", f"file://{tmp_path}/none", "-o", str(tmp_path / "x.jsonl")]) == 2
    assert "does not exist or holds no batch" in capsys.readouterr().err


def test_unusable_locations_fail_naming_them(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    with pytest.raises(StorageError, match="'nosuch://b/p': pyarrow cannot open it"):
        open_store("nosuch://b/p")
    with pytest.raises(StorageError, match="a file:// URI names a path on this machine"):
        open_store("file://elsewhere/records")
    (tmp_path / "f").write_text("")
    with pytest.raises(OSError, match="cannot write records to .*/f/store/'"):
        RecordWriter(str(tmp_path / "f" / "store") + "/")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # pyarrow not installed
    with pytest.raises(StorageError, match=r"records 's3://k:\*\*\*@b/p': s3:// needs pyarrow: "
                                           r"pip install 'raytune-kernels\[storage\]'"):
        open_store("s3://k:secret@b/p")
    assert load_records(f"file://{tmp_path}/none").records == []  # file:// needs no pyarrow


def test_the_driver_resolves_paths_and_validates_uris_up_front(tmp_path, monkeypatch):
    from actors.driver import TuneError, canonical_records_path

    pytest.importorskip("pyarrow")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    assert canonical_records_path("r.jsonl") == str(tmp_path / "r.jsonl")
    assert canonical_records_path("dir") == str(tmp_path / "dir") + os.sep
    assert canonical_records_path("new/") == str(tmp_path / "new") + os.sep
    assert canonical_records_path("s3://b/p?region=x") == "s3://b/p?region=x"
    with pytest.raises(TuneError, match="records 'gopher://b/p': pyarrow cannot open it"):
        canonical_records_path("gopher://b/p")


def test_records_on_s3(s3_endpoint, s3_store, tmp_path):
    with pytest.raises(OSError, match=r"cannot write records to 's3://test:\*\*\*@nobucket/"
                                      r".*Bucket 'nobucket' not found"):
        RecordWriter(s3_uri(s3_endpoint, "nobucket"))
    assert load_records(s3_store).records == [] and missing_records(s3_store)
    _write_concurrently(s3_store)
    _check_two_writers(s3_store)
    assert distill(s3_store, str(tmp_path / "best.jsonl")) == 2
    back = s3_store.replace("/records?", "/best?")
    assert distill(str(tmp_path / "best.jsonl"), back) == 2
    assert {(r.task_key, r.median) for r in load_records(back)} == {("w0", 1.0), ("w1", 1.0)}


def test_a_malformed_line_on_s3_is_skipped(s3_store):
    from pyarrow import fs

    with RecordWriter(s3_store) as w:
        w.write_batch([rec("a")])
    filesystem, root = fs.FileSystem.from_uri(s3_store)
    with filesystem.open_output_stream(f"{root}/99999999999999999999-torn.jsonl") as f:
        f.write(b'{"task_key": "a", "tar')
    with pytest.warns(UserWarning, match=r"'?s3://test:\*\*\*@.*: skipped 1 malformed record "
                                         r"line\(s\), first at batch 9+-torn.jsonl line 1"):
        assert [r.task_key for r in load_records(s3_store)] == ["a"]


def test_batches_within_the_sync_interval_go_into_one_object(tmp_path, monkeypatch):
    store = str(tmp_path / "store") + "/"
    clock = [100.0]
    monkeypatch.setattr("raytune_kernels.tune.records.time.monotonic", lambda: clock[0])
    w = RecordWriter(store, sync_s=1.0)
    w.write_batch([rec("a", 1.0)])  # the first batch is put at once
    for b in range(5):
        clock[0] += 0.1
        w.write_batch([rec("b", 2.0 + b)])
    assert len(open_store(store).batches()) == 1  # the others wait for the interval
    clock[0] += 0.6
    w.write_batch([rec("c", 9.0)])  # 1.1 s after the first: the six held go in one object
    assert len(open_store(store).batches()) == 2
    w.write_batch([rec("d", 1.0)])
    w.close()  # close puts what is held
    assert len(open_store(store).batches()) == 3
    assert [r.task_key for r in load_records(store)] == ["a"] + ["b"] * 5 + ["c", "d"]
