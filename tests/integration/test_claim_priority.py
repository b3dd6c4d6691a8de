"""New work first: the claim takes first attempts before re-dispatches (later attempts), whatever their age, and
tops a short batch up with re-dispatches. Real rows, real concurrent transactions for the locking cases."""

import psycopg
import pytest
from django.db import connection

from dispatch_app.dispatch.claim import ENVELOPE, claim_batch
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.models import DispatchEnvelope
from tests.factories import EnvelopeFactory, JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def envelopes(attempt: int, n: int, *, age_s: float) -> list[int]:
    """``n`` due envelopes of ``attempt``, all due ``age_s`` seconds ago (database clock)."""
    ids = [EnvelopeFactory(job=JobFactory(attempt=attempt)).pk for _ in range(n)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {ENVELOPE} SET available_at = clock_timestamp() - make_interval(secs => %s) WHERE id = ANY(%s)",
            [age_s, ids],
        )
    return sorted(ids)


def claimed_ids(limit: int) -> list[int]:
    return [e.envelope_id for e in claim_batch(limit, 30).envelopes]


def test_first_attempts_are_claimed_before_older_redispatches_and_sent_first():
    again = envelopes(2, 3, age_s=60)  # a recovery burst, due a minute ago
    new = envelopes(1, 3, age_s=0.5)
    assert claimed_ids(3) == new
    assert claimed_ids(3) == again


def test_a_short_batch_is_topped_up_with_redispatches_in_due_order_after_the_new_work():
    again = envelopes(3, 2, age_s=30) + envelopes(2, 2, age_s=10)  # attempt does not rank them: due time does
    new = envelopes(1, 2, age_s=1)
    claim = claim_batch(5, 30)
    assert [e.envelope_id for e in claim.envelopes] == new + again[:3]
    assert [e.attempt for e in claim.envelopes] == [1, 1, 3, 3, 2]
    assert claimed_ids(5) == again[3:]


def test_a_first_attempt_held_by_another_transaction_is_skipped_and_the_batch_topped_up():
    new = envelopes(1, 3, age_s=1)
    again = envelopes(2, 2, age_s=5)
    with psycopg.connect(**listener_conninfo()) as holder:
        holder.execute(f"SELECT id FROM {ENVELOPE} WHERE id = %s FOR UPDATE", [new[0]])
        assert claimed_ids(3) == [*new[1:], again[0]]
        holder.rollback()
    assert claimed_ids(3) == [new[0], again[1]]
    assert DispatchEnvelope.objects.filter(lease_token__isnull=True).count() == 0
