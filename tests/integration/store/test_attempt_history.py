"""Per-attempt history: every writer (dispatcher, worker, retry, recovery, operator) leaves one JobAttempt row per
attempt, written by triggers from database timestamps, and a later attempt never rewrites an earlier one."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from dispatch_app.actions import operator as actions
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.domains.providers import LocalProvider, set_provider
from dispatch_app.execution import execute
from dispatch_app.models import DispatchEnvelope, Job, JobAttempt
from dispatch_app.outbox.submit import submit
from dispatch_app.store.transitions import redispatch
from dispatch_app.store.triggers import history as history_triggers
from dispatch_app.timeline import stages
from tests.factories import PAYLOADS
from tests.integration.opsdata import sql

pytestmark = pytest.mark.django_db(transaction=True)  # the worker and the dispatcher commit


@pytest.fixture
def provider(tmp_path):
    provider = LocalProvider(root=tmp_path, latency_ms=0, failure_rate=0.0)
    set_provider(provider)
    yield provider
    set_provider(None)


def drain() -> int:
    loop = DispatchLoop(dispatch_settings())
    try:
        return loop.run_once("notify").dispatched
    finally:
        loop.close()


def attempts(job: Job) -> dict[int, JobAttempt]:
    return {a.attempt: a for a in JobAttempt.objects.filter(job=job)}


def test_each_attempt_keeps_its_own_dispatch_start_and_end(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])
    assert not JobAttempt.objects.filter(job=job).exists()  # due at once: no row until something happens

    assert drain() == 1
    # The mark writes nothing more: the dispatch time stays on the envelope until the attempt starts.
    assert not JobAttempt.objects.filter(job=job).exists()
    env1 = DispatchEnvelope.objects.get(job=job, attempt=1)

    assert execute("delivery", job.pk, 1) == {"succeeded": True}
    first = attempts(job)[1]
    job.refresh_from_db()
    assert first.dispatched_at == env1.dispatched_at and first.created_at == env1.created_at
    assert (first.started_at, first.finished_at, first.outcome) == (job.started_at, job.finished_at, "succeeded")
    assert first.created_at <= first.dispatched_at <= first.started_at <= first.finished_at
    assert first.domain == "delivery"


def test_a_redispatch_closes_the_old_attempt_and_never_rewrites_it(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])
    drain()
    with transaction.atomic(), connection.cursor() as cursor:
        # A worker started attempt 1 and died: the job is running on nobody.
        cursor.execute(
            "UPDATE dispatch_app_job SET status = 'running', started_at = clock_timestamp() WHERE id = %s", [job.pk]
        )
    before = attempts(job)[1]
    assert before.started_at is not None and before.finished_at is None

    with transaction.atomic():
        assert redispatch(job.pk, 1, kind="recovery_redispatch", reason="worker gone", delay_seconds=30) == 2
    rows = attempts(job)
    old, new = rows[1], rows[2]
    assert (old.dispatched_at, old.started_at) == (before.dispatched_at, before.started_at)
    assert old.outcome == "superseded" and old.finished_at == new.created_at
    # The retry's delay is a backoff, remembered as the envelope's first due time.
    env2 = DispatchEnvelope.objects.get(job=job, attempt=2)
    assert new.due_at == env2.available_at
    assert (new.due_at - new.created_at).total_seconds() == pytest.approx(30, abs=1)
    assert new.dispatched_at is None and new.started_at is None

    actions.retry_envelope_now(env2.pk)  # the operator cuts the backoff short
    assert drain() == 1
    assert execute("delivery", job.pk, 2) == {"succeeded": True}
    rows = attempts(job)
    assert (rows[1].dispatched_at, rows[1].started_at, rows[1].outcome) == (
        before.dispatched_at,
        before.started_at,
        "superseded",
    )
    assert rows[2].dispatched_at == DispatchEnvelope.objects.get(job=job, attempt=2).dispatched_at
    assert rows[2].outcome == "succeeded" and rows[2].started_at > rows[1].started_at


def test_the_worker_names_itself_in_its_start_statement_and_the_error_keeps_class_and_traceback(redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    drain()
    with transaction.atomic(), connection.cursor() as cursor:
        # What the worker's start does to name itself: set_config inside the start statement, no extra round trip.
        cursor.execute(
            "UPDATE dispatch_app_job SET status = 'running', started_at = clock_timestamp() "
            f"FROM (SELECT set_config('{history_triggers.WORKER_SETTING}', %s, true)) w "
            "WHERE id = %s AND status IN ('submitted', 'queued')",
            ["host-a.1234.worker-7", job.pk],
        )
    assert attempts(job)[1].worker == "host-a.1234.worker-7"
    error = "dispatch_app.domains.providers.ProviderError: boom\n\nTraceback (most recent call last):\n" + "x" * 9000
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_app_job SET status = 'failed', finished_at = clock_timestamp(), error = %s WHERE id = %s",
            [error, job.pk],
        )
    row = attempts(job)[1]
    assert row.outcome == "failed" and len(row.error) == history_triggers.ERROR_MAX
    assert row.error.startswith("dispatch_app.domains.providers.ProviderError: boom\n\nTraceback")
    assert row.worker == "host-a.1234.worker-7"  # the finish does not erase who ran it


def test_a_rearmed_dead_envelope_reopens_the_same_attempt(redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    env = DispatchEnvelope.objects.get(job=job)
    # Dead-lettered the way the dispatcher does it: envelope dead, job failed.
    sql("UPDATE dispatch_app_dispatchenvelope SET status = 'dead', last_error = 'refused' WHERE id = %s", [env.pk])
    sql(
        "UPDATE dispatch_app_job SET status = 'failed', finished_at = clock_timestamp(), "
        "error = 'dispatch failed: refused' WHERE id = %s",
        [job.pk],
    )
    row = attempts(job)[1]
    assert (row.outcome, row.error) == ("failed", "dispatch failed: refused") and row.finished_at is not None

    assert actions.rearm_envelope(env.pk).applied
    row = attempts(job)[1]
    assert (row.outcome, row.finished_at) == ("", None)
    assert drain() == 1
    job.refresh_from_db()
    envelopes = list(DispatchEnvelope.objects.filter(job=job))
    (current,) = stages.job_attempts(job, envelopes)
    assert current.dispatched_at == envelopes[0].dispatched_at and current.outcome == ""


def test_the_dispatchers_mark_does_not_fire_the_job_row_trigger(redis_conn):
    """submitted→queued is left to the envelope trigger, so the mark pays no per-row function call."""
    job = submit("delivery", PAYLOADS["delivery"])
    sql(
        "INSERT INTO dispatch_app_jobattempt (job_id, attempt, domain, created_at, worker, outcome, error) "
        "VALUES (%s, 1, 'delivery', clock_timestamp(), 'marker', '', '')",
        [job.pk],
    )
    sql("UPDATE dispatch_app_job SET status = 'queued' WHERE id = %s", [job.pk])
    row = attempts(job)[1]
    assert row.worker == "marker" and row.dispatched_at is None and row.outcome == ""


def test_the_backfill_rebuilds_the_current_attempt_and_earlier_ones_from_envelopes(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])
    drain()
    with transaction.atomic():
        redispatch(job.pk, 1, kind="recovery_redispatch", reason="lost")
    drain()
    execute("delivery", job.pk, 2)
    expected = {a.attempt: (a.dispatched_at, a.outcome) for a in JobAttempt.objects.filter(job=job)}
    sql("DELETE FROM dispatch_app_jobattempt")
    sql(history_triggers.BACKFILL_SQL)
    rows = attempts(job)
    assert {k: (a.dispatched_at, a.outcome) for k, a in rows.items()} == expected
    job.refresh_from_db()
    assert (rows[2].started_at, rows[2].finished_at) == (job.started_at, job.finished_at)
    assert rows[1].finished_at == DispatchEnvelope.objects.get(job=job, attempt=2).created_at
