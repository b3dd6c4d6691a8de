"""The dispatch-latency metric's outbox wait starts when the envelope is due, not at a delay's or backoff's start."""

from datetime import timedelta

import pytest
from django.db import connection

from dispatch_app import submit
from dispatch_app.dispatch import claim
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db


def _age_envelopes(seconds: float) -> None:
    """As if every envelope, and its delay, had been created `seconds` earlier."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_app_dispatchenvelope SET created_at = created_at - make_interval(secs => %s),"
            " available_at = available_at - make_interval(secs => %s)",
            [seconds, seconds],
        )
        cursor.execute(
            "UPDATE dispatch_app_jobattempt SET created_at = created_at - make_interval(secs => %s),"
            " due_at = due_at - make_interval(secs => %s)",
            [seconds, seconds],
        )


def test_a_delayed_envelopes_wait_counts_from_its_due_time_and_an_immediate_one_from_its_creation():
    submit("delivery", PAYLOADS["delivery"], available_at=timedelta(seconds=60))
    submit("delivery", PAYLOADS["delivery"])
    _age_envelopes(70)  # the delayed one has been due for ~10 s; the other waited ~70 s

    batch = claim.claim_batch(10, 30)
    latencies: list[float] = []
    assert claim.mark_dispatched([e.envelope_id for e in batch.envelopes], batch.token, latencies) == 2

    delayed, immediate = sorted(latencies)
    assert 9 < delayed < 30, latencies  # from due (~10 s ago), not from creation (~70 s ago)
    assert immediate >= 70, latencies
