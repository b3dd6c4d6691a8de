"""A failing background mark of batch N does not drop batch N+1's marks (failpoint ``fail_background_mark``).

Batch N is recorded on the marker thread while batch N+1 is claimed and sent.
When batch N's write fails, batch N+1 is already in Redis: its marks are still
written before the error surfaces. Batch N's envelopes come back when their
lease runs out, and their re-send is a duplicate (a no-op in Redis).
"""

import pytest

from dispatch_app import submit_many
from dispatch_app.config import failpoints
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.models import DispatchEnvelope
from dispatch_app.rq.publish import Publisher
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)

B = 3


def test_the_next_batch_is_marked_even_when_the_previous_batchs_mark_fails(redis_conn, monkeypatch):
    conf = loop_settings(BATCH_SIZE=B, SEND_CHUNK_SIZE=B)
    jobs = submit_many([("delivery", PAYLOADS["delivery"])] * (B + 2))
    first_batch, second_batch = [j.pk for j in jobs[:B]], [j.pk for j in jobs[B:]]
    loop = DispatchLoop(conf, publisher=Publisher(conf, redis_conn))
    try:
        monkeypatch.setattr(failpoints, "ACTIVE", frozenset({"fail_background_mark"}))
        with pytest.raises(RuntimeError, match="failpoint fail_background_mark"):
            loop.run_once()

        # Batch 2 (sent after batch 1's mark was handed to the marker) is marked anyway.
        assert set(DispatchEnvelope.objects.filter(job_id__in=second_batch).values_list("status", flat=True)) == {
            "dispatched"
        }
        # Batch 1 stays leased, as after a crash; it is in Redis already.
        pending = DispatchEnvelope.objects.filter(job_id__in=first_batch)
        assert {(e.status, e.lease_token is not None) for e in pending} == {("pending", True)}
        assert redis_conn.llen("rq:queue:delivery") == B + 2

        monkeypatch.setattr(failpoints, "ACTIVE", frozenset())
        DispatchEnvelope.objects.filter(status="pending").update(available_at="2000-01-01T00:00:00Z")
        again = loop.run_once()
    finally:
        loop.close()

    assert (again.dispatched, again.duplicates) == (B, B)
    assert DispatchEnvelope.objects.filter(status="dispatched").count() == B + 2
    assert redis_conn.llen("rq:queue:delivery") == B + 2, "the re-send queued nothing twice"
