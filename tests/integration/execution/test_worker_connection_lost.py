"""A database session that dies in the middle of the work is no verdict on the work: the job is retried, not failed."""

import dataclasses

import psycopg
import pytest
from django.db import connection

from dispatch_app import domains, submit
from dispatch_app.execution import execute
from dispatch_app.models import DispatchEnvelope, JobEvent, JobStatus
from tests.factories import PAYLOADS
from tests.helpers import database_url_for_subprocess

pytestmark = pytest.mark.django_db(transaction=True)  # the worker manages its own connection


def _terminate_my_session_then_query(ctx) -> dict:
    """As a pg_terminate_backend or a failover would do between two statements of the work."""
    pid = connection.connection.info.backend_pid
    with psycopg.connect(database_url_for_subprocess(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # the work's next statement meets the dead session
    return {}


def test_a_terminated_session_mid_work_becomes_the_next_attempt_not_a_failure(monkeypatch, settings):
    settings.DISPATCH = {"SEND_BACKOFF_BASE": 0}
    job = submit("workflow", PAYLOADS["workflow"])
    domain = domains.get_domain("workflow")
    with domains.registry.replaced(dataclasses.replace(domain, work=_terminate_my_session_then_query)):
        assert execute("workflow", job.pk, 1) == {"retrying": True}

    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.SUBMITTED, 2)
    assert DispatchEnvelope.objects.get(job=job, attempt=2).status == "pending"
    assert (
        "database connection lost during the work" in JobEvent.objects.get(job=job, kind="retry_after_failure").reason
    )
