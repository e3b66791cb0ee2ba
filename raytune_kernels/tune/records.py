"""Tuning records: append-only JSON lines, one per measured candidate, in a file or in a
record store (storage.py: immutable batches on a local disk, S3, GCS, ...).

Plain data only: loading records parses JSON and never executes anything (no pickle, no
eval). A malformed line is skipped with one warning that counts them, so a half-written
last line from a killed writer loses only itself.
"""
from __future__ import annotations

import functools
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from raytune_kernels.tune.storage import StorageError, is_store, open_store, redact
from raytune_kernels.version import __version__

SCHEMA = 1


def versions() -> dict[str, str]:
    return dict(_versions())


@functools.cache
def _versions() -> tuple[tuple[str, str], ...]:
    import llvmlite

    return (("raytune_kernels", __version__), ("llvmlite", llvmlite.__version__),
            ("torch", _torch_version()), ("python", platform.python_version()))


def _torch_version() -> str:
    """PyTorch's version, read from its package metadata where this process has not
    imported it: the processes that only write records (the scheduler) stay torch-free."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            return importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            import torch
    return torch.__version__


def config_key(config: dict) -> str:
    """A config's JSON (Config.to_json) as one canonical string: a record's identity within
    its task."""
    return json.dumps(config, sort_keys=True)


class MalformedRecord(ValueError):
    """A records line that is not a valid record (says what is wrong)."""


@dataclass(frozen=True)
class Record:
    task_key: str
    target: str
    device: str  # the measuring CPU (LLVM's host name) or GPU (its product name)
    config: dict
    times: tuple[float, ...]
    error_kind: str | None = None
    error_msg: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    timestamp: float = field(default_factory=time.time)
    versions: dict = field(default_factory=dict)
    schema: int = SCHEMA
    threads: int = 1  # threads the kernel ran with: part of what the time means
    cold_weights: bool = False  # timed with its weights out of cache, as in a network
    # the measuring CPU's vector instruction sets (cpu/machine.host_isa); None: a GPU, or a
    # record written before the field existed (matched by device name alone)
    isa: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None and bool(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.ok else math.inf

    def config_key(self) -> str:
        return config_key(self.config)

    def to_json(self) -> dict:
        return {"schema": self.schema, "task_key": self.task_key, "target": self.target,
                "device": self.device, "config": self.config, "times": list(self.times),
                "error_kind": self.error_kind, "error_msg": self.error_msg,
                "build_s": self.build_s, "run_s": self.run_s, "timestamp": self.timestamp,
                "versions": self.versions, "threads": self.threads,
                "cold_weights": self.cold_weights,
                **({"isa": self.isa} if self.isa is not None else {})}

    @classmethod
    def from_json(cls, d: object) -> "Record":
        if not isinstance(d, dict):
            raise MalformedRecord(f"a record is a JSON object, got {type(d).__name__}")
        _require(d, {"task_key": str, "target": str, "device": str, "config": dict,
                     "times": list})
        if d.get("schema", SCHEMA) > SCHEMA:
            raise MalformedRecord(f"schema {d['schema']} is newer than {SCHEMA}")
        times = tuple(d["times"])
        if not all(isinstance(t, (int, float)) and t >= 0 for t in times):
            raise MalformedRecord("times must be non-negative numbers")
        return cls(d["task_key"], d["target"], d["device"], d["config"], tuple(map(float, times)),
                   d.get("error_kind"), str(d.get("error_msg", "")), float(d.get("build_s", 0)),
                   float(d.get("run_s", 0)), float(d.get("timestamp", 0)),
                   dict(d.get("versions", {})), int(d.get("schema", SCHEMA)),
                   _threads(d.get("threads", 1)), bool(d.get("cold_weights", False)),
                   _isa(d.get("isa")))


def _isa(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise MalformedRecord(f"isa must be a string, got {value!r}")
    return value


def _threads(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise MalformedRecord(f"threads must be a positive integer, got {value!r}")
    return value


def _require(d: dict, fields: dict) -> None:
    for name, kind in fields.items():
        if name not in d:
            raise MalformedRecord(f"missing field '{name}'")
        if not isinstance(d[name], kind):
            raise MalformedRecord(f"field '{name}' should be {kind.__name__}")


SYNC_S = 1.0  # RecordWriter's default: at most one fsync (or store object) per second


class RecordWriter:
    """The single writer of a records location; fails early on an unwritable one.

    A file gets each batch appended and flushed to the operating system at once, so a
    killed driver loses at most the batch in flight (half a line, skipped on load); it is
    fsynced at most once per `sync_s` seconds (and on close), so a machine that goes down
    loses at most the batches written since the last sync. A record store gets the
    batches of up to `sync_s` seconds as one new object (one upload per second rather
    than one per round), so a killed driver loses at most the batches not yet put.
    `sync_s=0`: every batch synced or put as it comes. `flush()` syncs or puts now."""

    def __init__(self, path: str, sync_s: float = SYNC_S):
        self.path, self.sync_s = path, sync_s
        self._pending: list[str] = []  # a store's batches not put yet
        self._unsynced = False  # a file's batches not fsynced yet
        self._synced_at = -math.inf  # monotonic time of the last sync or put
        self._store = open_store(path) if is_store(path) else None
        if self._store is not None:
            self._store.prepare()
            return
        try:
            self._f = open(path, "a", encoding="utf-8")
        except OSError as exc:
            raise OSError(f"cannot write records to {path!r}: {exc.strerror}") from None
        if self._f.tell() and not _ends_with_newline(path):
            self._f.write("\n")  # end a line torn by a killed writer; it stays one bad line

    def write_batch(self, records: Iterable[Record]) -> None:
        text = "".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in records)
        if not text:
            return
        if self._store is not None:
            self._pending.append(text)
        else:
            self._f.write(text)
            self._f.flush()
            self._unsynced = True
        if time.monotonic() - self._synced_at >= self.sync_s:
            self.flush()

    def flush(self) -> None:
        """Make every batch written so far durable: fsynced, or put into the store."""
        self._synced_at = time.monotonic()
        if self._store is not None:
            if self._pending:  # an empty object would hold nothing
                self._store.put("".join(self._pending).encode("utf-8"))
                self._pending = []
        elif self._unsynced:
            os.fsync(self._f.fileno())
            self._unsynced = False

    def close(self) -> None:
        self.flush()
        if self._store is None:
            self._f.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


@dataclass
class Loaded:
    records: list[Record]
    skipped: int = 0

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def to_dataframe(self, weights: dict[str, int] | None = None):
        """One row per record, in this order (pandas: pip install pandas), with the tuning
        curves beside them; `weights` (task key -> weight) weighs the estimate (frames.py)."""
        from raytune_kernels.tune.frames import records_frame

        return records_frame(self.records, weights)


def load_records(path: str) -> Loaded:
    """Every valid record of a file, or of a record store (its batches in name order);
    malformed lines are counted, warned about (the first named by batch and line), skipped.
    A file or store that does not exist holds no records."""
    out: list[Record] = []
    if is_store(path):
        skipped, first = _parse(_batches(open_store(path)), out)
    elif not os.path.exists(path):
        return Loaded([])
    else:
        with open(path, encoding="utf-8", errors="replace") as f:
            skipped, first = _parse([("", f)], out)
    if skipped:
        warnings.warn(f"{redact(os.fspath(path))}: skipped {skipped} malformed record "
                      f"line(s), first at {first}", stacklevel=2)
    return Loaded(out, skipped)


def _batches(store) -> Iterator[tuple[str, list[str]]]:
    for name in store.batches():
        yield f"batch {name} ", store.read(name).decode("utf-8", errors="replace").split("\n")


def _parse(sources: Iterable[tuple[str, Iterable[str]]], out: list[Record]) -> tuple[int, str]:
    """Append the records of every (where, lines) to `out`; (lines skipped, the first)."""
    skipped, first = 0, ""
    for where, lines in sources:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                out.append(Record.from_json(json.loads(line)))
            except (ValueError, TypeError, RecursionError) as exc:  # a deeply nested line
                skipped += 1
                first = first or f"{where}line {number}: {exc}"
    return skipped, first


def describe_location(path: str) -> str:
    """How messages name `path`: records file 'x' or record store 'x'."""
    if is_store(path):
        return f"record store {redact(os.fspath(path))!r}"
    return f"records file {path!r}"


def missing_records(path: str) -> str | None:
    """What is wrong with reading records from `path` ("records file 'x' does not
    exist"), or None: a file that exists, a store that holds a batch."""
    if is_store(path):
        if not open_store(path).batches():
            return f"{describe_location(path)} does not exist or holds no batch"
    elif not os.path.exists(path):
        return f"{describe_location(path)} does not exist"
    return None


def best_per_task(records: Iterable[Record], target: str | None = None,
                  threads: int | None = None) -> dict[str, Record]:
    """Apply-history-best: the fastest valid record of each task (for one target and,
    when given, one thread count)."""
    best: dict[str, Record] = {}
    for r in records:
        if r.ok and (target is None or r.target == target) and \
                (threads is None or r.threads == threads):
            if r.task_key not in best or r.median < best[r.task_key].median:
                best[r.task_key] = r
    return best


def top_k(records: Iterable[Record], task_key: str, k: int) -> list[Record]:
    valid = [r for r in records if r.ok and r.task_key == task_key]
    return sorted(valid, key=lambda r: r.median)[:k]


# The knobs that decide which data layouts a config's kernel reads and writes: the CPU's
# channel blocks and output layout (layout/costs.layouts_of), the GPU's `layout`
# (cuda/render.cuda_layouts). tests/tune/test_records.py checks they stay in step.
LAYOUT_KNOBS = ("layout", "cb", "ob", "out_layout", "in_layout")


def distill_key(r: Record) -> tuple:
    """What compile_network tells apart among a task's records: target, threads, cold or
    warm weights, and the layouts the kernel reads and writes (the layout ILP weighs the
    best record of each layout against the transforms it saves)."""
    layout = tuple((k, str(r.config[k])) for k in LAYOUT_KNOBS if k in r.config)
    return r.task_key, r.target, r.threads, r.cold_weights, layout


def distill(src: str, dst: str, k: int = 1) -> int:
    """Write the best k valid records of every task to `dst`, per target, thread count,
    weight temperature and layout (distill_key): compiling from `dst` sees the same
    candidates as compiling from `src`. Each of `src` and `dst` is a file or a store; a
    file `dst` is replaced, a store `dst` must be empty (its batches are never replaced)."""
    records = load_records(src).records
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        if r.ok:
            groups.setdefault(distill_key(r), []).append(r)
    kept = [r for g in groups.values() for r in sorted(g, key=lambda r: r.median)[:k]]
    if is_store(dst):
        _distill_into_store(dst, kept)
        return len(kept)
    # a temp file of a unique name beside dst, renamed over it: two distills into the
    # same dst never share a temp file, and a reader sees the old file or the new one
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(dst) + ".", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(dst)))
    os.close(fd)
    try:
        with RecordWriter(tmp) as w:
            w.write_batch(kept)
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return len(kept)


def _distill_into_store(dst: str, kept: list[Record]) -> None:
    """One batch of the kept records into an empty store. A store with batches is refused:
    adding to it would mix the best records with the rest, and nothing there is removed."""
    held = len(open_store(dst).batches())
    if held:
        raise StorageError(f"cannot distill into {describe_location(dst)}: it already holds "
                           f"{held} batch(es), which are never replaced; name a new store or "
                           "a file")
    with RecordWriter(dst) as w:
        w.write_batch(kept)


def record_of(task_key: str, target: str, device: str, config: dict, result,
              threads: int = 1, cold_weights: bool = False, isa: str | None = None) -> Record:
    """A Record from a MeasureResult (anything with times/error_kind/error_msg/build_s/run_s)."""
    return Record(task_key, target, device, config, tuple(result.times), result.error_kind,
                  result.error_msg, result.build_s, result.run_s, time.time(), versions(),
                  threads=threads, cold_weights=cold_weights, isa=isa)


def measured_on(r: Record, device: str, isa: str | None = None) -> bool:
    """Whether `r` was measured on this device: the same CPU or GPU name and, where both
    name one, the same vector instruction sets (a VM may hide AVX-512 from a CPU whose
    name still says it has it). Times of another device say nothing of this one."""
    return r.device == device and (r.isa is None or isa is None or r.isa == isa)


def other_devices(records: Iterable[Record], device: str, isa: str | None = None
                  ) -> dict[str, int]:
    """How many of `records` were measured elsewhere, by device (its name, or "NAME [ISA]"
    where only the instruction sets differ)."""
    out: dict[str, int] = {}
    for r in records:
        if not measured_on(r, device, isa):
            name = r.device if r.device != device else f"{r.device} [{r.isa}]"
            out[name] = out.get(name, 0) + 1
    return out


def describe_devices(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} of {d}" for d, n in sorted(counts.items(), key=lambda x: -x[1]))
