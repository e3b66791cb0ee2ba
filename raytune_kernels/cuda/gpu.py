"""What the cost model needs to know of an NVIDIA GPU, taken from its arch alone.

The figures are the CUDA occupancy limits of the arch (CUDA C Programming Guide, "Technical
Specifications per Compute Capability") and the SM count of the datacenter part that arch
usually means (sm_80: A100, 108 SMs; sm_90: H100 SXM, 132 SMs). Search runs before any GPU
answers (and on machines without one), so nothing here asks a device: features only need
figures of the right size, and every candidate of a run is compared on the same figures.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from raytune_kernels.errors import UnknownTargetError


@dataclass(frozen=True)
class GpuInfo:
    """Occupancy limits of one arch, per streaming multiprocessor (SM)."""

    arch: str  # the NVRTC arch, e.g. "sm_90"
    sms: int
    smem_per_sm: int  # bytes of shared memory a block can share the SM with others
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int = 65536


# compute capability -> (SMs, shared memory per SM, threads per SM, blocks per SM)
ARCHS = {
    70: (80, 96 << 10, 2048, 32),    # V100
    75: (40, 64 << 10, 1024, 16),    # T4
    80: (108, 164 << 10, 2048, 32),  # A100
    86: (84, 100 << 10, 1536, 16),   # RTX 3090 / A40
    89: (128, 100 << 10, 1536, 24),  # RTX 4090 / L40
    90: (132, 228 << 10, 2048, 32),  # H100 SXM
}


def gpu_info(arch: str) -> GpuInfo:
    """The figures of `arch` ("sm_90", "sm_90a", ...). An arch newer than the table gets
    the newest older entry's figures (limits only grow between generations)."""
    m = re.fullmatch(r"sm_([0-9]{2,3})[a-z]?", arch or "")
    if not m:
        raise UnknownTargetError(f"bad cuda arch {arch!r}: expected sm_XY, e.g. sm_80")
    cc = int(m.group(1))
    known = [k for k in ARCHS if k <= cc]
    if not known:
        raise UnknownTargetError(f"cuda arch {arch} is older than the oldest supported "
                                 f"(sm_{min(ARCHS)})")
    return GpuInfo(arch, *ARCHS[max(known)])


def arch_has_mma(arch: str) -> bool:
    """Whether `arch` runs the tensor-core instructions of cuda/mma.py (mma.sync in tf32
    and bf16, cp.async, cvt to f16x2/bf16x2: sm_80 and newer)."""
    return _cc(arch)[0] >= 8


class ArchMismatchError(UnknownTargetError):
    """Cubins built for one arch cannot load on the GPU that would measure them."""


def _cc(arch: str) -> tuple[int, int, bool]:
    m = re.fullmatch(r"sm_([0-9]+)([0-9])(a?)", arch or "")
    if not m:
        raise UnknownTargetError(f"bad cuda arch {arch!r}: expected sm_XY, e.g. sm_80")
    return int(m.group(1)), int(m.group(2)), bool(m.group(3))


def cubin_loads_on(built: str, device: str) -> bool:
    """Whether a cubin built for `built` runs on a GPU of arch `device`: cubins are
    binary-compatible within a major version on devices of the same or a later minor one;
    arch-specific builds (sm_90a) only on exactly their arch."""
    (bmaj, bmin, bspecific), (dmaj, dmin, _) = _cc(built), _cc(device)
    if bspecific:
        return (bmaj, bmin) == (dmaj, dmin)
    return bmaj == dmaj and dmin >= bmin


def check_measurable(built: str, devices: list[str]) -> None:
    """Refuse a run whose every candidate would fail to load on some measuring GPU."""
    bad = sorted({d for d in devices if not cubin_loads_on(built, d)})
    if bad:
        raise ArchMismatchError(
            f"target asks for {built} cubins, which do not load on the measuring GPU(s) of "
            f"arch {', '.join(bad)}; give -arch={bad[0]} or no -arch (the GPU's own)")
