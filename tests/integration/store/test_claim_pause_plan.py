"""The claim's paused-domain filter keeps the claim index plan (no Sort) with domains paused, and claims nothing
of a paused domain until it is resumed."""

import pytest

from dispatch_app.actions import operator as actions
from dispatch_app.store.claim import claim_batch
from tests.integration.store.test_claim_plan import PENDING, claim_scans, explain
from tests.integration.store.test_claim_plan import big_outbox as big_outbox  # noqa: F401 - the fixture, reused

pytestmark = pytest.mark.django_db


def test_paused_domains_keep_the_index_plan_and_are_claimed_only_after_resume(big_outbox):  # noqa: F811
    for domain in ("image_series", "agent"):
        actions.pause_domain(domain)
    big_outbox.execute("ANALYZE dispatch_app_domainpause")
    nodes = explain(big_outbox, "COSTS OFF", 100)
    kinds = [n["Node Type"] for n in nodes]
    assert "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
    assert [(n["Node Type"], n.get("Index Name")) for n in claim_scans(nodes)] == [
        ("Index Scan", "envelope_claim_first"),
        ("Index Scan", "envelope_claim_again"),
    ]

    actions.pause_domain("delivery")  # every envelope of the big outbox
    assert claim_batch(100, 30).envelopes == []
    actions.resume_domain("delivery")
    assert len(claim_batch(PENDING, 30).envelopes) == PENDING // 2
