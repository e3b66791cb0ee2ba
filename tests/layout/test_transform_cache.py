"""Transform costs: measured together (parallel builds, one isolated child), kept per
machine, looked up by the next compile; a transform that crashes is only that one's inf."""
import math

import pytest

from raytune_kernels.cpu.build import build
from raytune_kernels.cpu.transform import Layout, transform_nest
from raytune_kernels.layout import costs, transform_cache
from raytune_kernels.measure import MeasureOptions

QUICK = MeasureOptions(min_repeat_ms=1, repeats=3)
KEYS = [((1, 32, 8, 8), "NCHW", "NCHW16c"), ((1, 32, 8, 8), "NCHW16c", "NHWC"),
        ((1, 16, 6, 6), "NHWC", "NCHW8c/p1x1"), ((1, 24, 4, 4), "NCHW", "NCHW16c"),
        ((1, 16, 6, 6), "NHWC", "NHWC")]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(transform_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(costs, "_measured", {})
    monkeypatch.setattr(costs, "_libraries", {})
    return tmp_path


def test_measured_once_then_looked_up_by_the_next_process(cache, monkeypatch):
    costs.measure_transforms(KEYS, QUICK)
    first = {k: costs.fastest_transform(*k, QUICK) for k in KEYS}
    assert all(0 < first[k][0] < 1e-2 for k in KEYS[:3])
    assert math.isinf(first[KEYS[3]][0]) and first[KEYS[4]] == (0.0, None)
    lines = (cache / "transforms.jsonl").read_text().splitlines()
    assert len(lines) == 3  # the timed ones; trivial costs need no cache
    # a new process: nothing in memory, nothing may be built or timed again
    monkeypatch.setattr(costs, "_measured", {})
    monkeypatch.setattr(costs, "build_transforms", pytest.fail)
    assert {k: costs.fastest_transform(*k, QUICK) for k in KEYS} == first
    # another timing protocol, or another generator or machine, is another key
    monkeypatch.setattr(transform_cache, "fingerprint", lambda: "another machine")
    assert transform_cache.lookup(*KEYS[0], QUICK) is None
    assert transform_cache.lookup(*KEYS[0], MeasureOptions(threads=2)) is None


def test_a_malformed_cache_line_is_ignored_and_an_empty_setting_turns_it_off(cache,
                                                                           monkeypatch):
    (cache / "transforms.jsonl").write_text('{"key": [1, \nnot json\n')
    costs.measure_transforms(KEYS[:1], QUICK)
    assert transform_cache.lookup(*KEYS[0], QUICK) == costs.fastest_transform(*KEYS[0], QUICK)
    monkeypatch.setenv(transform_cache.CACHE_ENV, "")
    monkeypatch.setattr(costs, "_measured", {})
    costs.measure_transforms(KEYS[1:2], QUICK)
    assert transform_cache.lookup(*KEYS[1], QUICK) is None


def test_parallel_builds_match_builds_here():
    items = [(*k, costs._few_configs(k[0])[0]) for k in KEYS[:3]] * 6  # enough for 2 children
    libraries = costs.build_transforms(items)
    assert all(lib is not None for lib in libraries)
    assert libraries[:3] == [costs._build_one(*item) for item in items[:3]]


def test_a_transform_that_crashes_is_inf_and_the_others_are_timed():
    shape, src, dst = KEYS[0]
    cfg = costs._few_configs(shape)[0]
    nest = transform_nest(shape, Layout.parse(src), Layout.parse(dst), cfg)
    segfault = build(f'define void @"{nest.name}"(ptr %a, ptr %b, i32 %n) {{\nentry:\n'
                     '  store volatile float 1.0, ptr inttoptr (i64 8 to ptr)\n  ret void\n}\n')
    assert segfault.error is None, segfault.error
    good = costs._build_one(shape, src, dst, cfg)
    seconds = costs.time_isolated([(shape, src, dst, cfg, good),
                                   (shape, src, dst, cfg, segfault.library),
                                   (shape, src, dst, cfg, None),
                                   (shape, src, dst, cfg, good)], QUICK)
    assert 0 < seconds[0] < 1e-2 and 0 < seconds[3] < 1e-2
    assert math.isinf(seconds[1]) and math.isinf(seconds[2])


def test_a_kernel_built_by_a_child_is_kept_for_the_next_compile(cache):
    """The transform a plan loads was built in a child; it goes to the library cache, so
    the next compile neither times nor builds it."""
    shape, src, dst = KEYS[0]
    costs.transform_kernel.cache_clear()  # loaded by another test: not this process's
    costs.measure_transforms([KEYS[0]], QUICK)
    cfg = costs.fastest_transform(shape, src, dst, QUICK)[1]
    kernel = costs.transform_kernel(shape, Layout.parse(src), Layout.parse(dst), cfg)
    assert kernel is not None
    assert len(list((cache / "libraries").glob("*.so"))) == 1


def test_a_tile_one_column_wide_where_channels_are_innermost_on_both_sides():
    assert costs._few_configs((1, 64, 28, 28), "NCHW64c", "NHWC/p1x1")[0]["tile_w"] == 1
    assert costs._few_configs((1, 64, 28, 28), "NHWC", "NCHW16c")[0]["tile_w"] == 1
    assert costs._few_configs((1, 64, 28, 28), "NCHW", "NCHW16c")[0]["tile_w"] == 8
    assert costs._few_configs((1, 64, 28, 28), "NCHW16c/p1x1", "NCHW")[0]["tile_w"] == 8
