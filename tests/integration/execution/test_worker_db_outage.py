"""A worker saving what already happened waits out PostgreSQL being away, on fresh connections with backoff.

Found by fault scenario 41 (PostgreSQL crashes): the one retry of an outcome or
a vendor call's answer met the server still restarting, and the job ended
``outcome_unknown`` though the worker knew what the vendor had answered. Real
connections: the default alias is pointed at a port nothing listens on (as
while PostgreSQL restarts) and back; the clock and sleep are the test's.
"""

from __future__ import annotations

import logging

import psycopg
import pytest
from django.db import OperationalError, connection, transaction

from dispatch_app import submit
from dispatch_app.db.retry import on_fresh_connections
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.execution import start_protocol
from dispatch_app.models import JobAttempt, JobStatus
from dispatch_app.store.transitions import start

pytestmark = pytest.mark.django_db(transaction=True)
log = logging.getLogger("test.dbretry")


class Away:
    """The server is away (the alias points nowhere) until ``back_after`` sleeps have passed."""

    def __init__(self, back_after: int | None):
        self.port = connection.settings_dict["PORT"]
        self.back_after = back_after
        self.now = 0.0
        self.sleeps: list[float] = []
        connection.close()
        connection.settings_dict["PORT"] = 1

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 3))
        self.now += seconds
        if len(self.sleeps) == self.back_after:
            self.back()

    def back(self) -> None:
        connection.settings_dict["PORT"] = self.port


def test_a_server_away_for_a_while_is_waited_out(caplog):
    away = Away(back_after=2)
    tries = []

    def run(cursor, retry):
        tries.append(retry)
        cursor.execute("SELECT 41")
        return cursor.fetchone()[0]

    try:
        value = on_fresh_connections(
            run, log, "lost %s", "x", action="t_retry", wait=15, sleep=away.sleep, clock=away.clock
        )
    finally:
        away.back()
    assert value == 41
    # At once (a terminated backend's next connection works), then with backoff while refused.
    assert away.sleeps == [0.1, 0.2]
    assert tries == [True], "the statement ran once, connected, flagged as a retry"
    assert [r.action for r in caplog.records if getattr(r, "action", "").startswith("t_")] == ["t_retry"]


def test_a_server_away_past_the_wait_raises_after_exactly_the_wait():
    away = Away(back_after=None)
    try:
        with pytest.raises(OperationalError):
            on_fresh_connections(
                lambda cursor, retry: cursor.execute("SELECT 1"),
                log,
                "lost",
                action="t_retry",
                wait=1.0,
                sleep=away.sleep,
                clock=away.clock,
            )
    finally:
        away.back()
    assert away.sleeps == [0.1, 0.2, 0.4, 0.3], "backoff doubling, the last step cut to the wait"
    assert away.now == pytest.approx(1.0)


def test_inside_a_transaction_the_error_goes_to_the_transactions_owner():
    calls = []

    def never(seconds):
        raise AssertionError("no retry inside a transaction")

    with pytest.raises(OperationalError), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        with psycopg.connect(autocommit=True, **listener_conninfo()) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        on_fresh_connections(
            lambda cursor, retry: calls.append(retry) or cursor.execute("SELECT 1"),
            log,
            "lost",
            action="t_retry",
            wait=15,
            sleep=never,
        )
    assert calls == [False]


# --- the start --------------------------------------------------------------
PAYLOAD = {"asset": "a-1", "target": "https://target.example.invalid/1"}


def start_elsewhere(job_id: int, worker: str) -> None:
    """The start, committed on another session: as a first try whose answer the dead connection lost."""
    with psycopg.connect(autocommit=True, **listener_conninfo()) as other:
        assert start(other.cursor(), worker, job_id, 1) is not None


def kill_own_session() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with psycopg.connect(autocommit=True, **listener_conninfo()) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]


def test_a_start_whose_answer_was_lost_is_found_as_this_workers_own(monkeypatch):
    job = submit("delivery", PAYLOAD)
    start_elsewhere(job.pk, "pf.host.1.me")
    kill_own_session()
    row = start_protocol.start(job.pk, 1, None, worker="pf.host.1.me")
    assert row is not None, "the start this worker made is not refused as a duplicate"
    job.refresh_from_db()
    assert (job.status, row[2]) == (JobStatus.RUNNING, job.started_at)


def test_a_retried_start_never_takes_another_workers_start(monkeypatch):
    job = submit("delivery", PAYLOAD)
    start_elsewhere(job.pk, "pf.host.2.other")
    kill_own_session()
    # a duplicate delivery, as without the retry
    assert start_protocol.start(job.pk, 1, None, worker="pf.host.1.me") is None


def test_a_start_whose_first_try_met_a_dead_session_starts_the_job(monkeypatch):
    job = submit("delivery", PAYLOAD)
    kill_own_session()
    assert start_protocol.start(job.pk, 1, None, worker="pf.host.1.me") is not None
    assert JobAttempt.objects.get(job=job, attempt=1).worker == "pf.host.1.me"
