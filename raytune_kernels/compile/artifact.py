"""A compiled network as one file, and back: net.save(path) / raytune_kernels.load(path)
(compile/api.py, which knows both networks).

The file is what a serving process needs and nothing else: the plan (steps, buffers,
layouts), the packed weights and the machine code (each CPU kernel's shared library, the
native runners' and border fills'; each GPU kernel's cubin), so loading it imports neither
Ray, XGBoost nor PuLP, reads no records, and times and solves nothing. The graph's
original weights stay behind (graph_without_weights): the packed ones are what runs.

Layout: MAGIC, the header's length (8 bytes, little-endian), the header (JSON: format
version, target, the machine the code was built for, the arrays' table, the payload's
length and SHA-256), then the payload: the network's state pickled with every array and
tensor left out, then those arrays' bytes one after another. Loading reads each array's
bytes straight into memory placed as the kernels want it (aligned(), huge pages for big
ones), hashing as it reads, and unpickles the small plan last. Everything is checked
before anything is unpickled: a file of another format version, a truncated or altered
file, a CPU without an instruction-set extension the kernels were built with (the missing
ones named), or a GPU of another arch is refused with an ArtifactError saying which. The
plan is a pickle: load only files you trust, as with torch.load.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import io
import json
import os
import pickle
import struct
import tempfile
import warnings

import numpy as np
import torch

from raytune_kernels.errors import RaytuneError
from raytune_kernels.version import __version__

MAGIC = b"RKNET\x00\r\n"  # a CR-LF inside tells a file mangled as text from a network
FORMAT_VERSION = 2
# the CPU features that decide which instructions the kernels may hold (LLVM's names)
ISA_PREFIXES = ("sse", "ssse3", "avx", "fma", "f16c", "bmi", "popcnt", "lzcnt", "movbe",
                "amx", "vpclmulqdq", "gfni", "vaes", "adx", "sha", "aes")
CHUNK = 64 << 20  # bytes read (and hashed) at a time


class ArtifactError(RaytuneError):
    """A saved network that cannot be loaded here; the message says why."""


def save(path: str, state: dict, machine: dict) -> None:
    """Write a network's state (its state() method) and the machine its code was built for
    (its machine() method) to `path`, atomically: a file that exists is either the old one
    or the whole new one."""
    plan, blobs, table = _pickle_plan(state)
    digest = hashlib.sha256(plan)
    for b in blobs:
        digest.update(b)
    header = {"format": FORMAT_VERSION, "raytune_kernels": __version__,
              "torch": torch.__version__, "created": _now(), "machine": machine,
              "plan_bytes": len(plan), "arrays": table,
              "payload_bytes": len(plan) + sum(b.nbytes for b in blobs),
              "payload_sha256": digest.hexdigest()}
    text = json.dumps(header, sort_keys=True).encode()
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".rkn_", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(text)) + text + plan)
            for b in blobs:
                f.write(b)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def open_state(path: str, check_machine: bool = True) -> tuple[dict, dict]:
    """The header and the unpickled state of a saved network, refused (ArtifactError)
    unless it is whole, of this format, and (with check_machine) its code runs here.
    compile/api.py's load() turns the state into a network."""
    with _opened(path) as f:
        header = _header(f, path)
        problem = machine_problem(header["machine"]) if check_machine else None
        if problem:
            raise ArtifactError(f"{path}: {problem}")
        plan, arrays = _payload(f, path, header)
    with warnings.catch_warnings():  # torch's own pickled pytree specs of islands
        warnings.filterwarnings("ignore", ".*LeafSpec.* is deprecated", FutureWarning)
        return header, _Unpickler(io.BytesIO(plan), arrays).load()


def read(path: str) -> tuple[dict, bytes]:
    """The header and the payload's bytes of a saved network, its checksum verified."""
    with _opened(path) as f:
        header = _header(f, path)
        payload = f.read()
    _check_length(path, header, len(payload))
    if _sha(payload) != header["payload_sha256"]:
        raise _corrupted(path)
    return header, payload


def graph_without_weights(graph):
    """`graph` (a frontend Graph) with its parameters as shapes only (meta tensors): a
    saved network runs on its packed weights, and the originals would double the file."""
    params = {k: torch.empty_like(v, device="meta") for k, v in graph.params.items()}
    return dataclasses.replace(graph, params=params)


# ---------------------------------------------------------------------- arrays apart

class _Pickler(pickle.Pickler):
    """Pickles the plan, each numpy array and CPU tensor replaced by its index in
    `blobs` (the same object always by the same index)."""

    def __init__(self, f):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.blobs: list[np.ndarray] = []
        self.table: list[dict] = []
        self._index: dict[int, int] = {}
        self._alive: list = []  # keeps ids unique while pickling

    def persistent_id(self, obj):
        entry = _array_entry(obj)
        if entry is None:
            return None
        if id(obj) not in self._index:
            self._index[id(obj)] = len(self.blobs)
            self._alive.append(obj)
            self.blobs.append(_bytes_of(obj))
            self.table.append(entry)
        return self._index[id(obj)]


def _pickle_plan(state: dict) -> tuple[bytes, list[np.ndarray], list[dict]]:
    buf = io.BytesIO()
    p = _Pickler(buf)
    p.dump(state)
    return buf.getvalue(), p.blobs, p.table


def _array_entry(obj) -> dict | None:
    """The table entry of an array or tensor kept apart; None for anything else."""
    if type(obj) is np.ndarray and not obj.dtype.hasobject and obj.dtype.names is None:
        return {"kind": "numpy", "dtype": obj.dtype.str, "shape": list(obj.shape),
                "nbytes": obj.nbytes}
    if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.device.type == "cpu" \
            and obj.layout == torch.strided and not obj.is_quantized:
        return {"kind": "parameter" if isinstance(obj, torch.nn.Parameter) else "tensor",
                "dtype": str(obj.dtype).removeprefix("torch."), "shape": list(obj.shape),
                "nbytes": obj.numel() * obj.element_size(),
                "requires_grad": obj.requires_grad}
    return None


def _bytes_of(obj) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        return np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
    flat = obj.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def _room(entry: dict) -> np.ndarray:
    """Memory for an array's bytes, placed as the kernels want it: 64-byte aligned, on
    huge pages when big (cpu/build.py's aligned_empty)."""
    from raytune_kernels.cpu.build import aligned_empty

    n = entry["nbytes"]
    return aligned_empty((n + 3) // 4).view(np.uint8)[:n]


def _from_bytes(entry: dict, raw: np.ndarray):
    shape = tuple(entry["shape"])
    if entry["kind"] == "numpy":
        return raw.view(np.dtype(entry["dtype"])).reshape(shape)
    t = torch.from_numpy(raw).view(getattr(torch, entry["dtype"])).reshape(shape)
    if entry["kind"] == "parameter":
        return torch.nn.Parameter(t, requires_grad=entry["requires_grad"])
    return t.requires_grad_(entry["requires_grad"])


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, arrays: list):
        super().__init__(f)
        self.arrays = arrays

    def persistent_load(self, pid):
        return self.arrays[pid]


# ---------------------------------------------------------------------- reading

@contextlib.contextmanager
def _opened(path: str):
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from None
    with f:
        yield f


def _header(f, path: str) -> dict:
    start = f.read(len(MAGIC) + 8)
    if not start.startswith(MAGIC[:len(start)]) or not start:
        raise ArtifactError(f"{path} is not a saved raytune-kernels network (no "
                            f"{MAGIC[:5].decode()} header)")
    if len(start) < len(MAGIC) + 8:
        raise ArtifactError(f"{path} is truncated: it ends inside its header")
    (size,) = struct.unpack("<Q", start[len(MAGIC):])
    try:
        header = json.loads(f.read(size))
    except ValueError:
        raise ArtifactError(f"{path}: its header is damaged (not JSON)") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        found = header.get("format") if isinstance(header, dict) else None
        raise ArtifactError(f"{path} is in format version {found}; this "
                            f"raytune-kernels ({__version__}) reads version "
                            f"{FORMAT_VERSION}: compile the network again with it")
    return header


def _payload(f, path: str, header: dict) -> tuple[bytes, list]:
    """The plan's bytes and the arrays, read and hashed; refused unless whole."""
    _check_sizes(f, path, header)
    digest = hashlib.sha256()
    plan = f.read(header["plan_bytes"])
    digest.update(plan)
    got = len(plan)
    arrays = []
    for entry in header["arrays"]:
        raw = _room(entry)
        view = memoryview(raw)
        for at in range(0, entry["nbytes"], CHUNK):
            n = f.readinto(view[at:at + CHUNK])
            digest.update(view[at:at + n])
            got += n
            if n < min(CHUNK, entry["nbytes"] - at):
                _check_length(path, header, got)
        arrays.append(_from_bytes(entry, raw))
    got += len(f.read(1))
    _check_length(path, header, got)
    if digest.hexdigest() != header["payload_sha256"]:
        raise _corrupted(path)
    return plan, arrays


def _check_sizes(f, path: str, header: dict) -> None:
    """The header's sizes agree with each other and with the file, before any memory is
    set aside for the arrays (the checksum covers the payload, not the header)."""
    try:
        parts = int(header["plan_bytes"]) + sum(int(a["nbytes"]) for a in header["arrays"])
        ok = parts == header["payload_bytes"] and all(
            a["kind"] in ("numpy", "tensor", "parameter") for a in header["arrays"])
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise ArtifactError(f"{path}: its header is damaged (its sizes or array table do "
                            "not add up)")
    _check_length(path, header, os.fstat(f.fileno()).st_size - f.tell())


def _check_length(path: str, header: dict, got: int) -> None:
    if got != header["payload_bytes"]:
        raise ArtifactError(f"{path} is truncated or has bytes appended: its payload has "
                            f"{'more than ' if got > header['payload_bytes'] else ''}"
                            f"{got} bytes, the header says {header['payload_bytes']}")


def _corrupted(path: str) -> ArtifactError:
    return ArtifactError(f"{path} is corrupted: its payload's checksum does not match "
                         "the header's")
def machine_problem(machine: dict) -> str | None:
    """Why code built for `machine` (a header's) cannot run here; None when it can."""
    if machine["kind"] == "cuda":
        return _gpu_problem(machine)
    from raytune_kernels.cpu.build import host_cpu

    name, features = host_cpu()
    if machine.get("mcpu") and machine["mcpu"] != name:
        from raytune_kernels.cpu.probe import unusable_mcpu

        return unusable_mcpu(machine["mcpu"])
    missing = sorted(isa_features(machine["features"]) - isa_features(features))
    if missing:
        return (f"its kernels were built for {machine['cpu']} with "
                f"{', '.join(missing)}, which this CPU ({name}) lacks: compile the network "
                "on this machine (or for a CPU it can run, with -mcpu)")
    return None


def isa_features(features: str) -> set[str]:
    """The enabled instruction-set features of an LLVM feature string ("+avx2,-avx512f")."""
    return {f[1:] for f in features.split(",")
            if f.startswith("+") and f[1:].startswith(ISA_PREFIXES)}


def _gpu_problem(machine: dict) -> str | None:
    from raytune_kernels.cuda import device

    if device.gpu_count() == 0:
        return f"it runs on a CUDA GPU ({machine['arch']}), and none is visible here"
    here = device.device_arch()
    if here != machine["arch"]:
        return (f"its cubins were built for {machine['arch']}, and this GPU "
                f"({device.device_name()}) is {here}: compile the network for this GPU")
    return None


def cpu_machine(mcpu: str | None) -> dict:
    """The header's record of the CPU a network's kernels were built for."""
    from raytune_kernels.cpu.build import host_cpu

    name, features = host_cpu()
    return {"kind": "llvm", "cpu": mcpu or name, "mcpu": mcpu,
            "features": "" if mcpu else features}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
