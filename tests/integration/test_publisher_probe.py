"""A first send skips the Redis existence probe; a re-send after a lost lease probes and counts a duplicate."""

import pytest

from dispatch_app import submit_many
from dispatch_app.dispatch import claim
from dispatch_app.dispatch.publisher import Publisher
from dispatch_app.models import DispatchEnvelope
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db


def _exists_calls(redis_conn) -> int:
    return int(redis_conn.info("commandstats").get("cmdstat_exists", {}).get("calls", 0))


def test_first_sends_do_not_probe_and_resends_do(redis_conn):
    conf = loop_settings()
    publisher = Publisher(conf, connection=redis_conn)
    submit_many([("delivery", PAYLOADS["delivery"])] * 5)

    first = claim.claim_batch(10, 30)
    assert all(e.first_send for e in first.envelopes)
    before = _exists_calls(redis_conn)
    assert publisher.send(first.envelopes).sent == 5
    assert _exists_calls(redis_conn) == before

    # The dispatcher "died" before its mark: the lease runs out, a successor claims again.
    DispatchEnvelope.objects.update(available_at="2000-01-01T00:00:00Z")
    second = claim.claim_batch(10, 30)
    assert not any(e.first_send for e in second.envelopes)
    result = publisher.send(second.envelopes)

    assert (result.sent, result.duplicates) == (0, 5)
    assert _exists_calls(redis_conn) == before + 5
    assert redis_conn.llen("rq:queue:delivery") == 5
