"""The per-job statements run as server-side prepared statements on Django's own connection (dispatch_app.db.prepared):
each is prepared once per session and PostgreSQL settles on its generic plan, so it is no longer planned per job;
DISPATCH["PREPARED_STATEMENTS"] = False (PgBouncer in transaction mode) turns it off. Real PostgreSQL."""

import pytest
from django.db import DataError, connection

from dispatch_app import submit
from dispatch_app.db import prepared
from dispatch_app.execution import execute
from dispatch_app.store.claim import claim_batch, mark_dispatched
from tests.factories import PAYLOADS

# Transactional: the worker's connection check must not find itself inside the test's transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def prepared_statements() -> dict[str, tuple[int, int]]:
    """statement text -> (generic plans, custom plans) of this session's prepared statements."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}


def find(statements: dict, marker: str) -> list[tuple[int, int]]:
    return [plans for text, plans in statements.items() if marker in text]


def test_the_per_job_statements_are_prepared_once_and_run_on_their_generic_plan():
    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(8)]
    for _ in range(8):
        batch = claim_batch(1, 30)
        assert mark_dispatched([e.envelope_id for e in batch.envelopes], batch.token) == 1
    for job in jobs:
        assert execute("delivery", job.pk, 1) == {"succeeded": True}
    statements = prepared_statements()
    markers = (
        "INSERT INTO dispatch_app_job",
        "WITH first AS",
        "SET status = 'dispatched'",
        "SET status = 'running'",
        "result = ",
    )
    for marker in markers:
        (plans,) = find(statements, marker)  # one prepared statement each, reused by every job
        generic, custom = plans
        assert generic + custom == 8, (marker, plans)
        assert generic >= 3, f"{marker}: still planned per execution ({plans})"


def test_switched_off_nothing_is_prepared(settings):
    settings.DISPATCH = {**getattr(settings, "DISPATCH", {}), "PREPARED_STATEMENTS": False}
    job = submit("delivery", PAYLOADS["delivery"])
    batch = claim_batch(10, 30)
    assert [e.job_id for e in batch.envelopes] == [job.pk]
    assert execute("delivery", job.pk, 1) == {"succeeded": True}
    assert prepared_statements() == {}


def test_a_failing_prepared_statement_raises_djangos_own_error():
    # Callers catch django.db's errors (the worker's retry on a lost connection, dbretry): psycopg's must not leak.
    with pytest.raises(DataError), prepared.cursor() as cursor:
        cursor.execute("SELECT 1 / %s", [0])
