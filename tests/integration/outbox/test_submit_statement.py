"""submit writes job + envelope as one statement: one round trip, one transaction, rows as the ORM would write them."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from dispatch_app import JobSpec, submit, submit_many
from dispatch_app.models import DispatchEnvelope, Job
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_statement_and_no_transaction_control_of_its_own():
    with CaptureQueriesContext(connection) as queries:
        submit("delivery", PAYLOADS["delivery"])
    assert len(queries) == 1, [q["sql"][:80] for q in queries]
    assert "SAVEPOINT" not in queries[0]["sql"] and "BEGIN" not in queries[0]["sql"]


def test_the_returned_jobs_are_the_stored_rows_in_the_given_order():
    specs = [JobSpec(d, PAYLOADS[d]) for d in ("delivery", "workflow", "agent", "image_series", "partial_edit")]
    jobs = submit_many(specs)
    assert [j.domain for j in jobs] == [s.domain for s in specs]
    for job, spec in zip(jobs, specs, strict=True):
        stored = Job.objects.get(pk=job.pk)
        assert stored.domain == spec.domain and stored.payload == spec.payload
        assert (stored.status, stored.attempt, stored.error) == ("submitted", 1, "")
        assert job.submitted_at == stored.submitted_at and job.updated_at == stored.updated_at
        assert not job._state.adding
        envelope = DispatchEnvelope.objects.get(job=job)
        assert (envelope.attempt, envelope.domain, envelope.status, envelope.send_attempts) == (
            1,
            spec.domain,
            "pending",
            0,
        )
        assert envelope.lease_token is None and envelope.last_error == ""


def test_a_delay_is_added_to_the_database_clock():
    job = submit("delivery", PAYLOADS["delivery"], available_at=timedelta(hours=2))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM available_at - created_at) FROM dispatch_app_dispatchenvelope WHERE job_id = %s",
            [job.pk],
        )
        assert 7199 < cursor.fetchone()[0] < 7201


def test_an_absolute_time_is_kept():
    job = submit("delivery", PAYLOADS["delivery"])
    at = Job.objects.get(pk=job.pk).submitted_at + timedelta(days=1)
    later = submit("delivery", PAYLOADS["delivery"], available_at=at)
    assert DispatchEnvelope.objects.get(job=later).available_at == at


def test_inside_the_callers_transaction_its_rollback_removes_both_rows():
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        submit_many([("delivery", PAYLOADS["delivery"])] * 3)
        assert Job.objects.count() == 3 and DispatchEnvelope.objects.count() == 3
        raise Abort
    assert Job.objects.count() == 0 and DispatchEnvelope.objects.count() == 0


def test_a_failing_statement_writes_neither_row():
    # A job row without its envelope must be impossible: make the envelope insert fail.
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE dispatch_app_dispatchenvelope ADD CONSTRAINT test_refuse CHECK (queue <> 'delivery')"
        )
    try:
        with pytest.raises(Exception, match="test_refuse"):
            submit("delivery", PAYLOADS["delivery"])
        assert Job.objects.count() == 0
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE dispatch_app_dispatchenvelope DROP CONSTRAINT test_refuse")
