"""Record stores: a directory of immutable batch files, on the local disk (a directory,
file://) or on any filesystem pyarrow opens from a URI (s3://, gs://, ...).

Each write adds one new object of a unique, time-ordered name and touches nothing else, so
a store needs no append and no rename from an object store (whose single put is atomic), and
two writers into one store never collide: there is no manifest or other shared object to
race on. Reading lists the directory and returns the batches in name order, one stream.
Bytes only: records.py parses them. pyarrow (the `storage` extra) is imported only for a
URI other than file://.
"""
from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit
from urllib.request import url2pathname

from raytune_kernels.errors import RaytuneError

SUFFIX = ".jsonl"
# filesystems whose object appears whole when its upload completes: written in place
ATOMIC_PUT = {"s3", "gcs", "abfs"}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class StorageError(RaytuneError, ValueError):
    """A records location that cannot be used (names it and says why)."""


def is_uri(location: str) -> bool:
    return bool(_SCHEME.match(location))


def is_store(location) -> bool:
    """Whether `location` names a record store: every URI, and a local path that is a
    directory or ends with a separator. Any other local path is a JSON-lines file."""
    location = os.fspath(location)
    return is_uri(location) or location.endswith(("/", os.sep)) or os.path.isdir(location)


def redact(location: str) -> str:
    """`location` for messages: the secret of a `scheme://key:secret@...` URI hidden."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):[^/@]*@", r"\1:***@", location)


class Files(Protocol):
    """One directory of a filesystem, as a store uses it."""

    def names(self) -> list[str]: ...
    def read(self, name: str) -> bytes: ...
    def prepare(self) -> None: ...
    def put(self, name: str, data: bytes) -> None: ...


@dataclass(frozen=True)
class LocalFiles:
    """A directory on this machine: a batch is written under a hidden temp name, fsynced
    and renamed, so a reader never sees half of one."""
    root: str

    def names(self) -> list[str]:
        try:
            return os.listdir(self.root)
        except FileNotFoundError:
            return []

    def read(self, name: str) -> bytes:
        with open(os.path.join(self.root, name), "rb") as f:
            return f.read()

    def prepare(self) -> None:
        os.makedirs(self.root, exist_ok=True)

    def put(self, name: str, data: bytes) -> None:
        tmp = os.path.join(self.root, f".{name}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(self.root, name))
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a crash
        finally:
            os.close(fd)


@dataclass(frozen=True)
class ArrowFiles:
    """A directory of a pyarrow filesystem. Object stores get one upload per batch; other
    filesystems a temp name moved into place."""
    fs: object  # pyarrow.fs.FileSystem
    root: str

    def names(self) -> list[str]:
        from pyarrow.fs import FileSelector, FileType

        infos = self.fs.get_file_info(FileSelector(self.root, allow_not_found=True))
        return [i.base_name for i in infos if i.type == FileType.File]

    def read(self, name: str) -> bytes:
        with self.fs.open_input_stream(f"{self.root}/{name}") as f:
            return f.read()

    def prepare(self) -> None:
        self.fs.create_dir(self.root, recursive=True)

    def put(self, name: str, data: bytes) -> None:
        final = f"{self.root}/{name}"
        path = final if self.fs.type_name in ATOMIC_PUT else f"{self.root}/.{name}.tmp"
        with self.fs.open_output_stream(path) as f:
            f.write(data)
        if path != final:
            self.fs.move(path, final)


@dataclass
class BatchStore:
    """A record store: the batches of `location`, read in name order; each put is a new
    batch named `<nanoseconds>-<uuid>.jsonl` (time order, unique across writers)."""
    location: str
    files: Files
    _last: int = field(default=0, repr=False)

    def batches(self) -> list[str]:
        return sorted(n for n in self.files.names()
                      if n.endswith(SUFFIX) and not n.startswith("."))

    def read(self, name: str) -> bytes:
        return self.files.read(name)

    def prepare(self) -> None:
        """Create the directory, failing early (naming the store) where it cannot be."""
        try:
            self.files.prepare()
        except OSError as exc:
            raise OSError(f"cannot write records to {redact(self.location)!r}: "
                          f"{exc.strerror or exc}") from None

    def put(self, data: bytes) -> str:
        self._last = max(time.time_ns(), self._last + 1)  # a writer's own batches stay in order
        name = f"{self._last:020d}-{uuid.uuid4().hex}{SUFFIX}"
        self.files.put(name, data)
        return name


def open_store(location) -> BatchStore:
    """The store `location` names (see is_store). Opening touches no data; it fails,
    naming the location, on a URI whose filesystem cannot be had here."""
    location = os.fspath(location)
    if not is_uri(location):
        return BatchStore(location, LocalFiles(location))
    parts = urlsplit(location)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise StorageError(f"records {location!r}: a file:// URI names a path on this "
                               f"machine (file:///abs/path), not on host {parts.netloc!r}")
        return BatchStore(location, LocalFiles(url2pathname(parts.path)))
    return BatchStore(location, ArrowFiles(*_arrow_filesystem(location, parts.scheme)))


def _arrow_filesystem(location: str, scheme: str) -> tuple[object, str]:
    try:
        import pyarrow
        from pyarrow import fs
    except ImportError:
        raise StorageError(f"records {redact(location)!r}: {scheme}:// needs pyarrow: "
                           "pip install 'raytune-kernels[storage]'") from None
    try:
        filesystem, root = fs.FileSystem.from_uri(location)
    except (pyarrow.ArrowException, OSError, ValueError) as exc:
        raise StorageError(f"records {redact(location)!r}: pyarrow cannot open it as a "
                           f"record store ({exc})") from None
    return filesystem, root.rstrip("/")
