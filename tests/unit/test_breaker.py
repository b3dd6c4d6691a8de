"""The dispatch breaker: which Redis errors are an outage, and open / probe / close on an injected clock."""

import pytest
import redis
from redis import exceptions as rx

from dispatch_app.dispatch.breaker import CLOSED, HALF_OPEN, OPEN, UNREACHABLE, CircuitBreaker, outage_reason


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(
    ("error", "needle"),
    [
        (rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "OOM"),
        (rx.ReadOnlyError("You can't write against a read only replica."), "read-only"),
        (rx.BusyLoadingError("Redis is loading the dataset in memory"), "loading"),
        (rx.NoPermissionError("this user has no permissions to run the 'evalsha' command"), "NOPERM"),
        (rx.TryAgainError("Multiple keys request during rehashing of slot"), "TRYAGAIN"),
        (rx.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."), "MASTERDOWN"),
        (rx.AuthenticationError("invalid username-password pair"), "NOAUTH"),
        (redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), UNREACHABLE),
        (redis.TimeoutError("Timeout reading from socket"), UNREACHABLE),
        (ConnectionResetError(104, "Connection reset by peer"), UNREACHABLE),
        # Inside a Lua script Redis 6.2 wraps the code: redis-py sees a plain ResponseError.
        (
            redis.ResponseError(
                "Error running script (call to f_5cee): @user_script:16: @user_script: 16: "
                "-OOM command not allowed when used memory > 'maxmemory'."
            ),
            "OOM",
        ),
        (
            redis.ResponseError(
                "Error running script (call to f_5cee): @user_script:16: @user_script: 16: "
                "-READONLY You can't write against a read only replica."
            ),
            "read-only",
        ),
        (redis.ResponseError("MISCONF Redis is configured to save RDB snapshots, but cannot"), "MISCONF"),
        (redis.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL"), "busy"),
    ],
)
def test_server_wide_errors_are_an_outage(error, needle):
    reason = outage_reason(error)
    assert reason is not None and needle in reason


@pytest.mark.parametrize(
    "error",
    [
        redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        redis.ResponseError("Error running script (call to f_5cee): @user_script:22: WRONGTYPE Operation against"),
        redis.DataError("Invalid input of type: 'dict'"),
        ValueError("an envelope's own bad data"),
        rx.NoScriptError("No matching script. Please use EVAL."),
    ],
)
def test_an_envelopes_own_errors_are_not_an_outage(error):
    assert outage_reason(error) is None


def test_open_probe_after_the_backoff_then_close_on_success():
    clock = Clock()
    breaker = CircuitBreaker(base=1.0, cap=4.0, clock=clock)
    assert breaker.allow() and breaker.state == CLOSED

    assert breaker.failed("Redis refuses writes (OOM)", "OutOfMemoryError: ...") == 1.0
    assert breaker.state == OPEN and breaker.pauses == 1
    assert not breaker.allow()
    assert breaker.seconds_to_probe() == 1.0
    clock.now += 0.999
    assert not breaker.allow()
    clock.now += 0.001
    assert breaker.allow() and breaker.state == HALF_OPEN and breaker.probing

    # The probe fails: open again, twice as long, capped; still one pause.
    assert breaker.failed("Redis refuses writes (OOM)", "again") == 2.0
    clock.now += 2.0
    assert breaker.allow()
    assert breaker.failed("r", "e") == 4.0
    clock.now += 4.0
    assert breaker.allow()
    assert breaker.failed("r", "e") == 4.0
    assert breaker.pauses == 1
    snapshot = breaker.snapshot()
    assert (snapshot.state, snapshot.reason, snapshot.paused_seconds) == (OPEN, "r", 7.0)

    clock.now += 4.0
    assert breaker.allow()
    assert breaker.succeeded() == 11.0
    assert breaker.state == CLOSED and breaker.allow() and breaker.snapshot().state == CLOSED
    # A new outage starts over at the base delay.
    assert breaker.failed("r", "e") == 1.0 and breaker.pauses == 2


def test_half_open_with_nothing_to_send_stays_half_open_until_a_probe_answers():
    clock = Clock()
    breaker = CircuitBreaker(base=0.5, cap=0.5, clock=clock)
    breaker.failed("Redis unreachable", "ConnectionError")
    clock.now += 0.5
    assert breaker.allow() and breaker.allow()  # no send happened in between: the next drain is still the probe
    assert breaker.state == HALF_OPEN


def test_bad_backoff_is_refused():
    with pytest.raises(ValueError, match="base"):
        CircuitBreaker(base=0, cap=1)


def test_a_hold_failpoint_stands_still_then_returns(monkeypatch):
    from dispatch_app.config import failpoints

    monkeypatch.setattr(failpoints, "ACTIVE", frozenset({"hold_here"}))
    monkeypatch.setenv("PRODUCTFLOW_FAILPOINT_HOLD_SECONDS", "0")
    failpoints.hit("hold_here")  # returns: a hold is a delay, not an error
