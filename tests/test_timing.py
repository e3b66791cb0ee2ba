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


def test_a_disturbed_set_of_repeats_is_timed_again_and_the_most_settled_kept(monkeypatch):
    import raytune_kernels.timing as timing

    monkeypatch.setattr(timing, "RETRY_PAUSE_S", 0.0)
    # growth (one call of 1 s: number stays 1), a set whose median is 74% above its
    # fastest, a warm-up call, then a settled set; a further call would raise StopIteration
    times = iter([1.0, 5.7, 11.0, 9.9, 1.0, 0.12, 0.121, 0.119])
    opts = TimingOptions(warmup=0, min_repeat_ms=10, repeats=3, settle=0.15, retries=2)
    assert timing.time_runs(lambda n: next(times), opts) == [0.12, 0.121, 0.119]
    assert timing.unsettled([5.7, 11.0, 9.9]) == 9.9 / 5.7 - 1


def test_a_disturbance_that_outlasts_the_retries_stays_and_settle_zero_never_retimes(
        monkeypatch):
    import raytune_kernels.timing as timing

    monkeypatch.setattr(timing, "RETRY_PAUSE_S", 0.0)
    times = iter([1.0, 1.0, 3.0, 2.0,  # growth, then a set: median 2.0, fastest 1.0
                  1.0, 1.0, 2.5, 2.5,  # warm-up, a set: median 2.5 over 1.0, less settled
                  1.0, 1.0, 1.6, 1.6])  # warm-up, a set: median 1.6: the most settled
    opts = TimingOptions(warmup=0, min_repeat_ms=10, repeats=3, settle=0.15, retries=2)
    assert timing.time_runs(lambda n: next(times), opts) == [1.0, 1.6, 1.6]
    once = iter([1.0, 1.0, 3.0, 2.0])  # a fourth call would raise StopIteration
    assert timing.time_runs(lambda n: next(once), TimingOptions(0, 10, 3)) == [1.0, 3.0, 2.0]
