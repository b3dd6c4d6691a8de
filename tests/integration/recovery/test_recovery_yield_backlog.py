"""What a recovery round yields to: an outbox backlog the dispatcher has not served (real PostgreSQL)."""

from datetime import timedelta

import pytest

from dispatch_app import submit
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.models import DispatchEnvelope, DomainPause
from dispatch_app.runtime import assembly
from dispatch_app.runtime.supervisor import Supervisor
from dispatch_app.runtime.yielding import YieldingWait, outbox_backlog
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db

HOUR = 3600.0


def test_an_empty_outbox_is_no_backlog():
    assert outbox_backlog(grace=0.0) is False


def test_an_envelope_due_for_longer_than_the_grace_is_a_backlog():
    submit("delivery", PAYLOADS["delivery"])
    assert outbox_backlog(grace=0.0) is True
    assert outbox_backlog(grace=HOUR) is False  # due, but not for that long: the dispatcher is not behind


def test_envelopes_not_due_dispatched_or_of_a_paused_domain_are_no_backlog():
    submit("delivery", PAYLOADS["delivery"], available_at=timedelta(hours=1))  # a delay, or a give-back's backoff
    dispatched = submit("delivery", PAYLOADS["delivery"])
    DispatchEnvelope.objects.filter(job=dispatched).update(status="dispatched")
    assert outbox_backlog(grace=0.0) is False
    submit("delivery", PAYLOADS["delivery"])
    DomainPause.objects.create(domain="delivery")  # the claim passes its envelopes over; so does the yield
    assert outbox_backlog(grace=0.0) is False


def test_the_recovery_childs_loops_yield_at_most_one_period_and_in_process_loops_do_not():
    conf = dispatch_settings()
    child = Supervisor(conf, listen=False, dispatch=False)
    assembly.add_recovery_loops(child, conf, ["delivery"], yield_to_new_work=True)
    threads = Supervisor(conf, listen=False, dispatch=False)
    assembly.add_recovery_loops(threads, conf, ["delivery"])
    (loop,) = [r.loop for r in child.runners]
    assert isinstance(loop.waiter, YieldingWait) and loop.waiter.max_yield == loop.policy.period_seconds
    (plain,) = [r.loop for r in threads.runners]
    assert not isinstance(plain.waiter, YieldingWait)


def _index_scans(plan: dict) -> list[dict]:
    found = [plan] if plan.get("Node Type") == "Index Only Scan" or plan.get("Node Type") == "Index Scan" else []
    for child in plan.get("Plans", []):
        found += _index_scans(child)
    return found


def test_each_half_reads_its_claim_index_as_a_range_on_available_at():
    # A clock read per row would make available_at a filter over every pending envelope of the index.
    from django.db import connection, transaction

    from dispatch_app.runtime.yielding import BACKLOG_SQL

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("EXPLAIN (FORMAT JSON) " + BACKLOG_SQL, {"grace": 0.0})
        plan = cursor.fetchone()[0]
    plan = plan[0]["Plan"] if isinstance(plan, list) else plan
    scans = {scan["Index Name"]: scan for scan in _index_scans(plan) if scan["Index Name"].startswith("envelope_")}
    assert set(scans) == {"envelope_claim_first", "envelope_claim_again"}, scans
    for name, scan in scans.items():
        assert "available_at" in scan.get("Index Cond", ""), (name, scan)
        assert "available_at" not in scan.get("Filter", ""), (name, scan)
