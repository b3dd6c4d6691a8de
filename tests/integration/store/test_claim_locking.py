"""Claims on real PostgreSQL: SKIP LOCKED passes over held rows, concurrent claimers never overlap."""

import threading
import uuid

import psycopg
import pytest
from django.db import connection

from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.models import DispatchEnvelope
from dispatch_app.store.claim import CLAIM_SQL, ENVELOPE, claim_batch
from tests.factories import EnvelopeFactory

pytestmark = pytest.mark.django_db(transaction=True)


def make_envelopes(n: int) -> list[int]:
    ids = [EnvelopeFactory().pk for _ in range(n)]
    # Same available_at for all: the claim order is then the id order.
    DispatchEnvelope.objects.update(available_at=DispatchEnvelope.objects.order_by("id").first().available_at)
    return sorted(ids)


def raw_connection() -> psycopg.Connection:
    return psycopg.connect(**listener_conninfo())


def claim_on(conn: psycopg.Connection, limit: int) -> list[int]:
    rows = conn.execute(
        CLAIM_SQL, {"limit": limit, "lease": 30, "token": uuid.uuid4(), "again_limit": limit, "writer_grace": 2.0}
    ).fetchall()
    return sorted(r[0] for r in rows)


def test_rows_locked_by_an_open_transaction_are_skipped_then_claimed_once_released():
    ids = make_envelopes(6)
    front = ids[:2]
    with raw_connection() as holder:
        # An operator's long transaction holds the two oldest candidates.
        holder.execute(f"SELECT id FROM {ENVELOPE} WHERE id = ANY(%s) FOR UPDATE", [front])
        claimed = claim_batch(10, 30)
        assert sorted(e.envelope_id for e in claimed.envelopes) == ids[2:]
        holder.rollback()
    claimed = claim_batch(10, 30)
    assert sorted(e.envelope_id for e in claimed.envelopes) == front
    assert claim_batch(10, 30).envelopes == []


def test_a_claim_in_an_uncommitted_transaction_hides_its_rows_from_a_second_claimer():
    ids = make_envelopes(6)
    with raw_connection() as first, raw_connection() as second:
        got_first = claim_on(first, 4)  # transaction left open
        got_second = claim_on(second, 4)
        assert got_first == ids[:4]
        assert got_second == ids[4:]
        first.commit()
        second.commit()
    assert DispatchEnvelope.objects.filter(lease_token__isnull=False).count() == 6


def test_two_concurrent_claimers_never_get_the_same_envelope():
    n, batch = 400, 7
    make_envelopes(n)
    barrier = threading.Barrier(2)
    claimed: list[list[int]] = [[], []]
    errors = []

    def claimer(index):
        try:
            barrier.wait(10)
            while True:
                got = claim_batch(batch, 30).envelopes
                if not got:
                    break
                claimed[index].extend(e.envelope_id for e in got)
        except Exception as exc:  # surfaced below, not swallowed
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    first, second = set(claimed[0]), set(claimed[1])
    assert len(first) == len(claimed[0]) and len(second) == len(claimed[1])
    assert not first & second
    assert len(first | second) == n
    # Each envelope was claimed exactly once.
    assert set(DispatchEnvelope.objects.values_list("send_attempts", flat=True)) == {1}
