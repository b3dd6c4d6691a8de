"""The supervision of the recovery child, with real (short-lived) processes and an injected clock."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from dispatch_app.config.settings import validate
from dispatch_app.dispatch.wake import STOP, TICK
from dispatch_app.housekeeping.heartbeat import HeartbeatTracker
from dispatch_app.runtime.recovery_process import ChildExited, RecoveryProcessLoop, child_database_url


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def crashing() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])


def supervised(spawn, clock, **kwargs) -> RecoveryProcessLoop:
    conf = validate({"RECONNECT_BACKOFF_MAX": 4.0})
    return RecoveryProcessLoop(
        conf, ["delivery"], threading.Event(), spawn=spawn, clock=clock, backoff=1.0, stable_seconds=60.0, **kwargs
    )


def died(loop: RecoveryProcessLoop) -> str:
    loop.proc.wait(30)
    with pytest.raises(ChildExited) as death:
        loop.run_once()
    return str(death.value)


def test_a_child_that_keeps_dying_is_restarted_after_a_doubling_capped_backoff():
    clock = Clock()
    loop = supervised(crashing, clock)
    delays = []
    for _ in range(4):
        assert loop.run_once() is not None  # started
        message = died(loop)
        assert "died (exit code 7)" in message
        delays.append(loop.next_start - clock.now)
        assert loop.run_once() is None  # not before the backoff has passed
        clock.now = loop.next_start
    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert loop.starts == 4 and loop.exits == [7, 7, 7, 7]


def test_a_child_that_ran_for_the_stable_period_restarts_after_the_first_backoff_again():
    clock = Clock()
    loop = supervised(crashing, clock)
    for _ in range(3):
        loop.run_once()
        died(loop)
        clock.now = loop.next_start
    loop.run_once()
    clock.now += 60.0  # it lived long enough: its death is not a crash loop
    died(loop)
    assert loop.next_start - clock.now == 1.0


def test_a_child_that_cannot_be_started_is_an_error_and_retried_later():
    clock = Clock()

    def missing() -> subprocess.Popen:
        return subprocess.Popen(["/nonexistent/python"])

    loop = supervised(missing, clock)
    with pytest.raises(ChildExited, match="could not start"):
        loop.run_once()
    assert loop.next_start == clock.now + 1.0 and loop.proc is None


def test_wait_returns_stop_at_once_when_stopped():
    loop = supervised(crashing, Clock(), poll=30.0)
    loop.stop.set()
    assert loop.wait() == STOP


def test_wait_is_a_tick_while_the_child_runs():
    loop = supervised(crashing, Clock(), poll=0.0)
    assert loop.wait() == TICK


def test_reports_of_the_child_reach_the_heartbeat_rows_as_this_process_loops():
    tracker = HeartbeatTracker(clock=Clock())
    loop = supervised(crashing, Clock(), observer=tracker)
    loop.handle_report({"event": "tick", "loop": "recovery-delivery"})
    loop.handle_report({"event": "error", "loop": "recovery-delivery", "type": "OperationalError", "message": "gone"})
    loop.handle_report({"event": "hung", "loops": ["recovery-delivery"]})
    [(name, tick_ago, error_ago, error, errors)] = tracker.take()
    assert (name, tick_ago, error_ago, error, errors) == ("recovery-delivery", 0.0, 0.0, "OperationalError: gone", 1)
    assert loop.hung == ["recovery-delivery"]


@pytest.mark.parametrize(
    ("url", "name", "expected"),
    [
        ("postgres://u@db:5432/pf", "test_pf", "postgres://u@db:5432/test_pf"),
        ("postgres://u@db:5432/pf?sslmode=require", "pf", "postgres://u@db:5432/pf?sslmode=require"),
        ("postgresql://postgres:@/productflow?host=/tmp/pg", "test_x", "postgresql://postgres:@/test_x?host=/tmp/pg"),
    ],
)
def test_the_child_uses_the_database_the_parent_uses(url, name, expected):
    assert child_database_url(url, name) == expected
