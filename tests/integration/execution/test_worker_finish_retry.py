"""The outcome is saved even when the worker's connection died while the work ran."""

import psycopg
import pytest
from django.db import connection

from dispatch_app import submit
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.domains.providers import LocalProvider, set_provider
from dispatch_app.execution import execute
from dispatch_app.models import Job, JobStatus
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db(transaction=True)  # the worker manages its own connection


class TerminatingProvider(LocalProvider):
    """Delivers, after the server has ended the worker's session (a failover, an admin's pg_terminate_backend)."""

    def deliver(self, asset: str, target: str) -> dict:
        pid = connection.connection.info.backend_pid
        with psycopg.connect(autocommit=True, **listener_conninfo()) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        return super().deliver(asset, target)


@pytest.fixture
def terminating_provider(tmp_path):
    set_provider(TerminatingProvider(root=tmp_path, latency_ms=0, failure_rate=0))
    yield
    set_provider(None)


def test_the_outcome_survives_a_terminated_connection(terminating_provider):
    job = submit("delivery", PAYLOADS["delivery"])

    assert execute("delivery", job.pk, 1) == {"succeeded": True}

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert job.result == {"delivered": PAYLOADS["delivery"]["asset"], "target": PAYLOADS["delivery"]["target"]}
    assert Job.objects.filter(pk=job.pk, finished_at__isnull=False).exists()
