"""A vendor call's outcome is saved even when the worker's connection died while the vendor worked.

Found by fault scenario 40 (mixed chaos): a backend terminated during an image
call made the ledger's settle raise, and the job ended ``failed`` with the
OperationalError though the image had been made (and billed).
"""

import psycopg
import pytest

from dispatch_app import submit
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.domains.providers import LocalProvider, set_provider
from dispatch_app.execution import execute
from dispatch_app.models import Job, JobStatus, VendorCall

pytestmark = pytest.mark.django_db(transaction=True)  # the worker manages its own connection

PAYLOAD = {"image": "img-1", "region": [0, 0, 8, 8], "instruction": "brighter"}


class TerminatingProvider(LocalProvider):
    """Edits, after the server has ended every other session of the database (the worker's among them)."""

    terminated = 0

    def edit_image(self, request_id, source, region, instruction):
        with psycopg.connect(autocommit=True, **listener_conninfo()) as admin:
            TerminatingProvider.terminated += admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()[0]
        return super().edit_image(request_id, source, region, instruction)


@pytest.fixture
def terminating_provider(tmp_path):
    set_provider(TerminatingProvider(root=tmp_path, latency_ms=0, failure_rate=0))
    yield
    set_provider(None)


def test_the_call_outcome_survives_a_terminated_connection(terminating_provider):
    job = submit("partial_edit", PAYLOAD)

    assert execute("partial_edit", job.pk, 1) == {"succeeded": True}

    assert TerminatingProvider.terminated >= 1, "the fault did not happen"
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    calls = list(VendorCall.objects.filter(job=job).values_list("status", flat=True))
    assert calls == ["succeeded"]
    assert Job.objects.filter(pk=job.pk, finished_at__isnull=False).exists()


class TerminatingBeforeRecordProvider(LocalProvider):
    """The session dies between two calls: the second call's record meets a dead connection."""

    terminated = 0

    def new_request_id(self):
        with psycopg.connect(autocommit=True, **listener_conninfo()) as admin:
            TerminatingBeforeRecordProvider.terminated += admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()[0]
        return super().new_request_id()


def test_a_record_meeting_a_dead_connection_is_retried_once(tmp_path):
    set_provider(TerminatingBeforeRecordProvider(root=tmp_path, latency_ms=0, failure_rate=0))
    try:
        job = submit("partial_edit", PAYLOAD)
        assert execute("partial_edit", job.pk, 1) == {"succeeded": True}
    finally:
        set_provider(None)

    assert TerminatingBeforeRecordProvider.terminated >= 1, "the fault did not happen"
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert list(VendorCall.objects.filter(job=job).values_list("status", flat=True)) == ["succeeded"]
