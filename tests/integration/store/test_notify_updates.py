"""The re-arm trigger: an UPDATE notifies only when it makes work claimable now."""

import pytest

from dispatch_app import submit
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.models import DispatchEnvelope
from dispatch_app.store import claim
from tests.factories import PAYLOADS
from tests.integration.dispatch.test_notify import SENTINEL, armed, listen, received_until_sentinel, sentinel  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claimed(armed, listen, sentinel):  # noqa: F811
    """One envelope, claimed; the INSERT's notification already consumed."""
    submit("delivery", PAYLOADS["delivery"])
    sentinel()
    received_until_sentinel(listen)
    batch = claim.claim_batch(10, 60)
    assert len(batch.envelopes) == 1
    sentinel()
    assert received_until_sentinel(listen) == [SENTINEL], "a claim must stay silent"
    return batch


def _fail(batch, base: float):
    conf = dispatch_settings()
    return claim.mark_failed(
        [e.envelope_id for e in batch.envelopes],
        batch.token,
        "boom",
        permanent=False,
        max_attempts=conf.MAX_SEND_ATTEMPTS,
        backoff_base=base,
        backoff_cap=base,
    )


def test_a_backoff_into_the_future_is_silent(claimed, listen, sentinel):  # noqa: F811
    _fail(claimed, base=60)
    sentinel()
    assert received_until_sentinel(listen) == [SENTINEL]


def test_a_failed_send_due_at_once_notifies(claimed, listen, sentinel):  # noqa: F811
    _fail(claimed, base=0)
    sentinel()
    assert received_until_sentinel(listen) == ["delivery", SENTINEL]


def test_a_released_lease_notifies(claimed, listen, sentinel):  # noqa: F811
    claim.release([e.envelope_id for e in claimed.envelopes], claimed.token)
    sentinel()
    assert received_until_sentinel(listen) == ["delivery", SENTINEL]


def test_a_dead_envelope_rearmed_notifies(claimed, listen, sentinel):  # noqa: F811
    DispatchEnvelope.objects.filter(pk=claimed.envelopes[0].envelope_id).update(status="dead", lease_token=None)
    sentinel()
    assert received_until_sentinel(listen) == [SENTINEL], "dead-lettering is not new work"
    from dispatch_app.db.clock import ClockTimestamp

    DispatchEnvelope.objects.filter(pk=claimed.envelopes[0].envelope_id).update(
        status="pending", send_attempts=0, available_at=ClockTimestamp()
    )
    sentinel()
    assert received_until_sentinel(listen) == ["delivery", SENTINEL]


def test_a_give_back_of_many_notifies_once_per_domain_and_a_mark_is_silent(armed, listen, sentinel):  # noqa: F811
    for domain in ("delivery", "delivery", "delivery", "workflow"):
        submit(domain, PAYLOADS[domain])
    sentinel()
    received_until_sentinel(listen)
    batch = claim.claim_batch(10, 60)
    assert len(batch.envelopes) == 4
    kept = [e for e in batch.envelopes if e.domain == "workflow"]
    given = [e.envelope_id for e in batch.envelopes if e.domain == "delivery"]
    assert claim.release(given, batch.token) == 3
    sentinel()
    assert received_until_sentinel(listen) == ["delivery", SENTINEL]
    claim.mark_dispatched([e.envelope_id for e in kept], batch.token)
    sentinel()
    assert received_until_sentinel(listen) == [SENTINEL], "a mark makes nothing claimable"
