"""GPU descriptions by arch, and which cubins load on which GPU (no GPU needed)."""
import pytest

from raytune_kernels.cuda.gpu import ArchMismatchError, check_measurable, cubin_loads_on, gpu_info
from raytune_kernels.errors import UnknownTargetError


def test_figures_by_arch_and_newer_archs_take_the_newest_known():
    assert gpu_info("sm_90").sms == 132 and gpu_info("sm_80").sms == 108
    assert gpu_info("sm_100").sms == gpu_info("sm_90").sms
    with pytest.raises(UnknownTargetError, match="bad cuda arch"):
        gpu_info("compute_90")


@pytest.mark.parametrize("built, device, loads", [
    ("sm_80", "sm_80", True),
    ("sm_80", "sm_86", True),    # same major, later minor
    ("sm_86", "sm_80", False),   # an earlier minor lacks what was built for
    ("sm_80", "sm_90", False),   # cubins do not cross major versions
    ("sm_90", "sm_80", False),
    ("sm_90a", "sm_90", True),
    ("sm_90a", "sm_91", False),  # arch-specific builds run on exactly their arch
])
def test_cubin_compatibility(built, device, loads):
    assert cubin_loads_on(built, device) is loads


def test_a_run_whose_cubins_would_not_load_is_refused_naming_the_gpus():
    check_measurable("sm_90", ["sm_90", "sm_90"])
    with pytest.raises(ArchMismatchError, match="sm_80 cubins.* arch sm_90; give -arch=sm_90"):
        check_measurable("sm_80", ["sm_90", "sm_80"])
