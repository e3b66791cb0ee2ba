"""A compiled network as one file, and back: net.save(path) / raytune_kernels.load(path)
(compile/api.py, which knows both networks).

The file is what a serving process needs and nothing else: the plan (steps, buffers,
layouts), the packed weights and the machine code (each CPU kernel's shared library, the
native runners' and border fills'; each GPU kernel's cubin), so loading it imports neither
Ray, XGBoost nor PuLP, reads no records, and times and solves nothing.

Layout: MAGIC, the header's length (8 bytes, little-endian), the header (JSON: format
version, target, the machine the code was built for, the payload's length and SHA-256),
then the payload (the network's state, pickled by torch.save). Everything is checked
before the payload is unpickled: a file of another format version, a truncated or
altered file, a CPU without an instruction-set extension the kernels were built with (the
missing ones named), or a GPU of another arch is refused with an ArtifactError saying
which. The payload is a pickle: load only files you trust, as with torch.load.
"""
from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import struct
import tempfile

import torch

from raytune_kernels.errors import RaytuneError
from raytune_kernels.version import __version__

MAGIC = b"RKNET\x00\r\n"  # a CR-LF inside tells a file mangled as text from a network
FORMAT_VERSION = 1
# the CPU features that decide which instructions the kernels may hold (LLVM's names)
ISA_PREFIXES = ("sse", "ssse3", "avx", "fma", "f16c", "bmi", "popcnt", "lzcnt", "movbe",
                "amx", "vpclmulqdq", "gfni", "vaes", "adx", "sha", "aes")


class ArtifactError(RaytuneError):
    """A saved network that cannot be loaded here; the message says why."""


def save(path: str, state: dict, machine: dict) -> None:
    """Write a network's state (its state() method) and the machine its code was built for
    (its machine() method) to `path`, atomically: a file that exists is either the old one
    or the whole new one."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = {"format": FORMAT_VERSION, "raytune_kernels": __version__,
              "torch": torch.__version__, "created": _now(), "machine": machine,
              "payload_bytes": len(payload), "payload_sha256": _sha(payload)}
    text = json.dumps(header, sort_keys=True).encode()
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".rkn_", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(text)) + text + payload)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def open_state(path: str, check_machine: bool = True) -> tuple[dict, dict]:
    """The header and the unpickled state of a saved network, refused (ArtifactError)
    unless it is whole, of this format, and (with check_machine) its code runs here.
    compile/api.py's load() turns the state into a network."""
    header, payload = read(path)
    problem = machine_problem(header["machine"]) if check_machine else None
    if problem:
        raise ArtifactError(f"{path}: {problem}")
    return header, torch.load(io.BytesIO(payload), weights_only=False)


def read(path: str) -> tuple[dict, bytes]:
    """The header and the verified payload of a saved network."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not data.startswith(MAGIC):
        raise ArtifactError(f"{path} is not a saved raytune-kernels network (no "
                            f"{MAGIC[:5].decode()} header)")
    at = len(MAGIC) + 8
    if len(data) < at:
        raise ArtifactError(f"{path} is truncated: it ends inside its header")
    (size,) = struct.unpack("<Q", data[len(MAGIC):at])
    try:
        header = json.loads(data[at:at + size])
    except ValueError:
        raise ArtifactError(f"{path}: its header is damaged (not JSON)") from None
    if header.get("format") != FORMAT_VERSION:
        raise ArtifactError(f"{path} is in format version {header.get('format')}; this "
                            f"raytune-kernels ({__version__}) reads version "
                            f"{FORMAT_VERSION}: compile the network again with it")
    payload = data[at + size:]
    if len(payload) != header["payload_bytes"]:
        raise ArtifactError(f"{path} is truncated or has bytes appended: its payload has "
                            f"{len(payload)} bytes, the header says "
                            f"{header['payload_bytes']}")
    if _sha(payload) != header["payload_sha256"]:
        raise ArtifactError(f"{path} is corrupted: its payload's checksum does not match "
                            "the header's")
    return header, payload


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
