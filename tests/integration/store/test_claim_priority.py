"""New work first: the claim takes first attempts before re-dispatches (later attempts), whatever their age, and
tops a short batch up with re-dispatches. Real rows, real concurrent transactions for the locking cases."""

import psycopg
import pytest
from django.db import connection

from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.models import DispatchEnvelope
from dispatch_app.store.claim import ENVELOPE, claim_batch
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


def test_a_claim_takes_at_most_its_share_of_redispatches_and_says_more_may_be_due():
    from dispatch_app.store.claim import AGAIN_PER_CLAIM

    again = envelopes(2, AGAIN_PER_CLAIM + 3, age_s=30)  # a recovery round's re-dispatches, committed together
    new = envelopes(1, 1, age_s=0.1)
    first = claim_batch(100, 30)
    assert [e.envelope_id for e in first.envelopes] == new + again[:AGAIN_PER_CLAIM]
    assert first.again_full is True
    second = claim_batch(100, 30)
    assert [e.envelope_id for e in second.envelopes] == again[AGAIN_PER_CLAIM:]
    assert second.again_full is False
    assert claim_batch(100, 30, again_limit=0).envelopes == []  # nothing of the kind left either way


def test_the_loop_drains_a_burst_of_redispatches_in_short_batches_without_waiting_for_a_wake(redis_conn):
    import threading

    from dispatch_app.dispatch.loop import DispatchLoop
    from dispatch_app.dispatch.wake import NOTIFY
    from dispatch_app.store.claim import AGAIN_PER_CLAIM
    from tests.integration.loop_kit import loop_settings

    burst = 2 * AGAIN_PER_CLAIM + 1
    again = envelopes(2, burst, age_s=5)
    loop = DispatchLoop(loop_settings(BATCH_SIZE=100), stop=threading.Event())
    try:
        result = loop.run_once(NOTIFY)
    finally:
        loop.close()
    assert result.batch_sizes == [AGAIN_PER_CLAIM, AGAIN_PER_CLAIM, 1]
    assert result.dispatched == burst
    assert DispatchEnvelope.objects.filter(id__in=again, status="dispatched").count() == burst
