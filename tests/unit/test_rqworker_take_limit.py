"""How many ready jobs a PipelineWorker takes at once: the wait in its hand stays within a budget."""

import pytest

from dispatch_app.rq.worker.worker import PREFETCH_WAIT_BUDGET, PipelineWorker


def worker(prefetch=8, job_seconds=0.0):
    w = PipelineWorker.__new__(PipelineWorker)  # the rule only, no Redis
    w.prefetch = prefetch
    w._job_seconds = job_seconds
    return w


@pytest.mark.parametrize(
    ("job_seconds", "expected"),
    [
        (0.0, 8),  # nothing ran yet: the whole prefetch (a backlog drains in batches)
        (0.0005, 8),  # 0.5 ms jobs: 10 fit the budget, the prefetch caps it
        (0.001, 6),  # the first runs at once, five wait at most 5 ms
        (0.003, 2),  # a burst of ~3 ms jobs is spread over the idle workers
        (PREFETCH_WAIT_BUDGET, 2),
        (0.02, 1),  # slower than the budget: one at a time
    ],
)
def test_take_limit_keeps_the_wait_in_hand_within_the_budget(job_seconds, expected):
    assert PREFETCH_WAIT_BUDGET == 0.005
    assert worker(job_seconds=job_seconds)._take_limit() == expected


def test_take_limit_never_exceeds_the_prefetch_setting():
    assert worker(prefetch=1, job_seconds=0.0)._take_limit() == 1
    assert worker(prefetch=3, job_seconds=0.0001)._take_limit() == 3


def test_recent_job_duration_is_a_moving_average():
    w = worker()
    w._ran(0.010)
    assert w._job_seconds == pytest.approx(0.010)  # the first job sets it
    for _ in range(30):
        w._ran(0.001)
    assert w._job_seconds == pytest.approx(0.001, rel=0.05)  # it follows what jobs take now
    w._ran(0.050)
    assert 0.001 < w._job_seconds < 0.02  # one slow job moves it, without swinging to one at a time
