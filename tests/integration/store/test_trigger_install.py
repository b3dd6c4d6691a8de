"""Our triggers as installed: no django-pgtrigger ignore check on their path, and ``updated_at`` stamped by the
database unless the statement set it (store.trigger_sql, models.Job)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from pgtrigger.core import INSTALLED

from dispatch_app.models import DispatchEnvelope, Job, JobAttempt
from dispatch_app.outbox import submit as outbox
from dispatch_app.store import transitions
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db(transaction=True)

MODELS = (Job, DispatchEnvelope)


def _row(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _job() -> Job:
    return Job.objects.create(domain="delivery", payload=dict(PAYLOADS["delivery"]))


def test_every_trigger_is_installed_as_the_models_declare_it():
    # The hash in each trigger's comment is computed from our template: a migration left behind reads OUTDATED.
    statuses = {
        trigger.name: trigger.get_installation_status(model)[0] for model in MODELS for trigger in model._meta.triggers
    }
    assert len(statuses) == 5
    assert set(statuses.values()) == {INSTALLED}, statuses


def test_no_trigger_function_on_a_jobs_tables_calls_the_ignore_check():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.tgname, p.prosrc FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE t.tgrelid IN ('dispatch_app_job'::regclass, 'dispatch_app_dispatchenvelope'::regclass) "
            "AND NOT t.tgisinternal"
        )
        functions = dict(cursor.fetchall())
    assert len(functions) == 5
    assert [name for name, source in functions.items() if "should_ignore" in source] == []


def test_an_update_that_leaves_updated_at_alone_is_stamped_with_database_time():
    job = _job()
    before = _row("SELECT updated_at FROM dispatch_app_job WHERE id = %s", [job.pk])[0]
    stamped, now = _row(
        "WITH u AS (UPDATE dispatch_app_job SET error = 'x' WHERE id = %s RETURNING updated_at) "
        "SELECT u.updated_at, clock_timestamp() FROM u",
        [job.pk],
    )
    assert before < stamped <= now
    # The ORM's save() writes every column, updated_at with the value it read: still stamped.
    job.refresh_from_db()
    job.error = "y"
    job.save()
    assert _row("SELECT updated_at FROM dispatch_app_job WHERE id = %s", [job.pk])[0] > stamped


def test_an_update_that_sets_updated_at_keeps_its_value():
    job = _job()
    kept, expected = _row(
        "WITH u AS (UPDATE dispatch_app_job SET updated_at = TIMESTAMPTZ '2001-02-03 04:05:06+00' "
        "WHERE id = %s RETURNING updated_at) SELECT u.updated_at, TIMESTAMPTZ '2001-02-03 04:05:06+00' FROM u",
        [job.pk],
    )
    assert kept == expected


def test_the_stores_start_and_finish_move_updated_at_themselves():
    job = _job()
    Job.objects.filter(pk=job.pk).update(status="queued")
    DispatchEnvelope.objects.create(
        job=job, attempt=1, domain="delivery", queue="delivery", status="dispatched", send_attempts=1
    )
    ages = [_row("SELECT updated_at FROM dispatch_app_job WHERE id = %s", [job.pk])[0]]
    with connection.cursor() as cursor:
        assert transitions.start(cursor, "w1", job.pk, 1) is not None
    ages.append(_row("SELECT updated_at FROM dispatch_app_job WHERE id = %s", [job.pk])[0])
    with connection.cursor() as cursor:
        assert transitions.finish(cursor, job.pk, 1, "succeeded")
    ages.append(_row("SELECT updated_at, clock_timestamp() FROM dispatch_app_job WHERE id = %s", [job.pk]))
    assert ages[0] < ages[1] < ages[2][0] <= ages[2][1]


def test_a_submit_writes_an_attempt_row_only_for_an_envelope_created_with_a_delay():
    # One statement inserting both: the due-time trigger's WHEN picks the delayed envelope's row alone.
    now, later = outbox.submit_many(
        [("delivery", dict(PAYLOADS["delivery"])), ("delivery", dict(PAYLOADS["delivery"]), timedelta(seconds=30))]
    )
    rows = list(JobAttempt.objects.filter(job__in=[now, later]).values_list("job_id", "due_at", "created_at"))
    assert [row[0] for row in rows] == [later.pk]
    envelope = DispatchEnvelope.objects.get(job=later)
    assert rows[0][1] == envelope.available_at and rows[0][2] == envelope.created_at
    assert 29 < (envelope.available_at - envelope.created_at).total_seconds() < 31
