"""The harness's arithmetic: percentiles, rates, ratios, medians over repeats.

Pure functions over plain lists, so tests/unit/test_bench_stats.py can pin them
on known inputs. Percentiles use linear interpolation between closest ranks
(numpy's default, "type 7"), so p50 of [1, 2, 3, 4] is 2.5.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    data = sorted(values)
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(data[low])
    return data[low] + (data[high] - data[low]) * (rank - low)


def summarize(values: Sequence[float]) -> dict[str, float | None]:
    """n, mean, min, p50, p95, p99, max of a sample (None where undefined)."""
    data = list(values)
    if not data:
        return {"n": 0, "mean": None, "min": None, "p50": None, "p95": None, "p99": None, "max": None}
    return {
        "n": len(data),
        "mean": sum(data) / len(data),
        "min": float(min(data)),
        "p50": percentile(data, 50),
        "p95": percentile(data, 95),
        "p99": percentile(data, 99),
        "max": float(max(data)),
    }


def rate(count: float, seconds: float) -> float | None:
    """Items per second; None when no time passed (a rate cannot be measured)."""
    if seconds is None or seconds <= 0:
        return None
    return count / seconds


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def median(values: Iterable[float | None]) -> float | None:
    """Median of the defined values (None ignored); None when none is defined."""
    data = [v for v in values if v is not None]
    return percentile(data, 50) if data else None


def median_metrics(runs: Sequence[dict]) -> dict:
    """Per-key median over repeated runs; non-numeric values come from the last run."""
    keys: list[str] = []
    for run in runs:
        keys.extend(k for k in run if k not in keys)
    merged = {}
    for key in keys:
        values = [run.get(key) for run in runs]
        numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numeric and len(numeric) == len([v for v in values if v is not None]):
            merged[key] = median(numeric)
        else:
            merged[key] = next((v for v in reversed(values) if v is not None), None)
    return merged


def cdf_points(values: Sequence[float], max_points: int = 200) -> list[tuple[float, float]]:
    """(value, fraction <= value) pairs for a CDF plot, thinned to about max_points."""
    data = sorted(values)
    n = len(data)
    if n == 0:
        return []
    step = max(1, math.ceil(n / max_points))
    points = [(float(data[i]), (i + 1) / n) for i in range(0, n, step)]
    if points[-1][1] != 1.0:
        points.append((float(data[-1]), 1.0))
    return points


def cumulative_progress(offsets: Iterable[float], bucket: float) -> list[tuple[float, int]]:
    """(time, items done by then) from per-item completion offsets, in buckets of `bucket` seconds."""
    if bucket <= 0:
        raise ValueError("bucket must be > 0")
    counts: dict[int, int] = {}
    for offset in offsets:
        index = max(0, math.ceil(offset / bucket))
        counts[index] = counts.get(index, 0) + 1
    if not counts:
        return []
    done = 0
    series = []
    for index in range(0, max(counts) + 1):
        done += counts.get(index, 0)
        series.append((round(index * bucket, 9), done))
    return series


def predicted_tick_wait(batches: int, interval: float) -> float:
    """The seed design's extra wait for a backlog of K full batches at one batch per tick: (K-1)*I."""
    return max(0, batches - 1) * interval


def batches_for(count: int, batch_size: int) -> int:
    """K: how many claims a backlog of `count` needs at `batch_size` per claim."""
    if batch_size < 1:
        raise ValueError("batch size must be >= 1")
    return math.ceil(count / batch_size)
