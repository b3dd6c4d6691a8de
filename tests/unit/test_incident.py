"""One log line per incident (dispatch_app.runtime.incident): the first with its traceback, a rate-limited
summary while it lasts, one line when it ends. Clocks injected: no sleeping."""

from __future__ import annotations

import logging

import pytest

from dispatch_app.runtime.incident import Incidents, signature


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def incidents(caplog):
    caplog.set_level(logging.INFO, logger="test.incident")
    clock = Clock()
    # Wall time 12:00:00 local, so the "since" in the summary is predictable.
    from datetime import datetime

    noon = datetime.now().replace(hour=12, minute=0, second=0, microsecond=0).timestamp()
    made = Incidents(logging.getLogger("test.incident"), summary_every=30, clock=clock, wall=lambda: noon)
    made.test_clock = clock
    return made


def redis_down(port: int = 6379) -> ConnectionError:
    try:
        raise ConnectionError(f"Error 111 connecting to 127.0.0.1:{port}. Connection refused.")
    except ConnectionError as exc:
        return exc


def lines(caplog):
    return [(r.levelname, getattr(r, "action", ""), r.getMessage(), r.exc_info is not None) for r in caplog.records]


def test_a_minute_of_the_same_failure_is_four_lines_not_a_hundred_and_twenty(incidents, caplog):
    for second in range(61):  # one failed round a second, in two loops, for a minute
        incidents.test_clock.now = 1000.0 + second
        incidents.failed("recovery-agent", "agent", redis_down(), "%s loop failed", "recovery-agent")
        incidents.failed("dispatch", "dispatch", redis_down(6380 + second), "%s loop failed", "dispatch")
    incidents.succeeded("dispatch")
    assert len(caplog.records) == 1 + 2  # the first (traceback) and two summaries (at 30 s, 60 s); not ended yet
    incidents.succeeded("recovery-agent")

    got = lines(caplog)
    assert got[0] == ("ERROR", "recovery-agent_error", "recovery-agent loop failed", True)
    assert [g[1] for g in got[1:]] == ["incident_ongoing", "incident_ongoing", "incident_ended"]
    assert got[1][2].startswith("still failing: 61 rounds since 12:00:00 (builtins.ConnectionError: Error #")
    assert "loops: dispatch, recovery-agent" in got[1][2]
    assert got[2][2].startswith("still failing: 121 rounds since 12:00:00")
    assert got[3][2].endswith("(122 rounds since 12:00:00)")
    assert not any(g[3] for g in got[1:]), "one traceback per incident"


def test_a_different_failure_is_a_new_incident_with_its_own_traceback(incidents, caplog):
    incidents.failed("dispatch", "dispatch", redis_down(), "dispatch loop failed")
    incidents.failed("dispatch", "dispatch", RuntimeError("disk full"), "dispatch loop failed", action="x_error")
    incidents.succeeded("dispatch")
    incidents.succeeded("dispatch")  # no incident open: silent
    got = lines(caplog)
    assert [(g[0], g[1], g[3]) for g in got] == [
        ("ERROR", "dispatch_error", True),
        ("INFO", "incident_ended", False),  # Redis: no longer what this loop fails with
        ("ERROR", "x_error", True),
        ("INFO", "incident_ended", False),
    ]


def test_a_stopped_loop_ends_its_incident_silently_and_the_next_failure_is_logged_again(incidents, caplog):
    incidents.failed("recovery-agent", "agent", redis_down(), "failed")
    incidents.forget("recovery-agent")
    incidents.failed("recovery-agent", "agent", redis_down(), "failed")
    assert [g[3] for g in lines(caplog)] == [True, True]


def test_the_signature_ignores_numbers_only():
    assert signature(redis_down(6379)) == signature(redis_down(6400))
    assert signature(redis_down()) != signature(TimeoutError("Error 111 connecting"))
