import time

from raytune_kernels.timing import TimingOptions, median, time_fn


def test_number_grows_until_a_repeat_lasts_min_repeat_ms():
    calls = []
    between = []

    def fn():
        calls.append(1)
        time.sleep(0.001)

    times = time_fn(fn, TimingOptions(warmup=2, min_repeat_ms=10, repeats=4),
                    lambda: between.append(len(calls)))
    assert len(times) == 4 and len(between) == 4  # every repeat kept, hook before each
    assert all(0.0009 < t < 0.005 for t in times) and 0.0009 < median(times) < 0.005
    per_repeat = between[1] - between[0]
    assert per_repeat >= 8  # number was grown: one call is 1 ms, a repeat lasts >= 10 ms
