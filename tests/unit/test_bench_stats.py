"""The benchmark harness's arithmetic on known inputs (bench.stats)."""

import pytest

from bench import stats


def test_percentile_interpolates_between_closest_ranks():
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5
    assert stats.percentile([4, 1, 3, 2], 0) == 1
    assert stats.percentile([4, 1, 3, 2], 100) == 4
    assert stats.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert stats.percentile(list(range(101)), 95) == 95
    assert stats.percentile([7], 99) == 7
    assert stats.percentile([], 50) is None


def test_percentile_rejects_out_of_range():
    with pytest.raises(ValueError):
        stats.percentile([1], 101)


def test_summarize_known_sample():
    s = stats.summarize([10, 20, 30, 40, 50])
    assert s == {"n": 5, "mean": 30, "min": 10, "p50": 30, "p95": 48, "p99": pytest.approx(49.6), "max": 50}
    assert stats.summarize([])["p50"] is None


def test_rate_and_ratio():
    assert stats.rate(100_000, 8) == 12_500
    assert stats.rate(5, 0) is None
    assert stats.ratio(900, 3) == 300
    assert stats.ratio(1, 0) is None
    assert stats.ratio(None, 2) is None


def test_median_metrics_over_repeats():
    runs = [{"p50": 1.0, "n": 10, "plan": "a"}, {"p50": 3.0, "n": 30, "plan": "b"}, {"p50": 2.0, "n": None}]
    merged = stats.median_metrics(runs)
    assert merged["p50"] == 2.0
    assert merged["n"] == 20  # median of the defined values 10 and 30
    assert merged["plan"] == "b"  # non-numeric: the last defined value


def test_cdf_points_end_at_one_and_thin_out():
    points = stats.cdf_points(list(range(1000)), max_points=100)
    assert len(points) <= 101
    assert points[0] == (0.0, 0.001)
    assert points[-1] == (999.0, 1.0)
    assert stats.cdf_points([]) == []


def test_cumulative_progress_buckets():
    assert stats.cumulative_progress([0.05, 0.1, 0.25, 0.3], 0.1) == [(0.0, 0), (0.1, 2), (0.2, 2), (0.3, 4)]
    with pytest.raises(ValueError):
        stats.cumulative_progress([1], 0)


def test_tick_wait_prediction():
    assert stats.batches_for(100_000, 100) == 1000
    assert stats.batches_for(101, 100) == 2
    assert stats.predicted_tick_wait(stats.batches_for(100_000, 500), 1.0) == 199.0
    assert stats.predicted_tick_wait(1, 1.0) == 0


def test_per_job_ms_splits_and_totals():
    from bench.cpu import per_job_ms

    out = per_job_ms({"worker": 2.0, "postgres": 1.0}, 1000)
    assert out == {"worker": pytest.approx(2.0), "postgres": pytest.approx(1.0), "total": pytest.approx(3.0)}
    assert per_job_ms({"worker": 2.0}, 0) == {"worker": None, "total": None}


def test_cpu_meter_counts_new_pids_from_zero_and_never_negative():
    from bench import cpu

    readings = iter([{1: 5.0, 2: 1.0}, {1: 5.5, 2: 0.5, 3: 0.25}])
    meter = cpu.CpuMeter({"c": lambda: [1, 2, 3]})
    meter._read = lambda: {"c": next(readings)}
    meter.snapshot()
    # pid 1 grew 0.5 s; pid 2 went backwards (a reused pid): 0; pid 3 is new: all of it.
    assert meter.delta() == {"c": pytest.approx(0.75)}


def test_process_cpu_of_this_process_grows_and_a_gone_pid_is_zero():
    import os
    import time

    from bench.cpu import process_cpu

    before = process_cpu(os.getpid(), children=False)
    # /proc counts in clock ticks (10 ms): burn well past one.
    until = time.process_time() + 0.05
    while time.process_time() < until:
        pass
    assert process_cpu(os.getpid(), children=False) > before
    assert process_cpu(2**22 + 12345) == 0.0
