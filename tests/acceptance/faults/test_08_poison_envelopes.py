"""Scenario 8: poison in the outbox.

- A payload the task cannot parse (changed in the table after submit, as a bad
  migration or a manual edit would): the worker refuses it and fails the job
  with the reason, once, without retrying.
- A domain no longer registered: the envelope is dead-lettered at its first
  send (a permanent error) with the reason; its job fails.
- An envelope whose send keeps failing with an error of its own (its queue's
  key in a private Redis holds a string, so its job's push is refused:
  ``WRONGTYPE``): dead after exactly MAX_SEND_ATTEMPTS, the reason kept, a
  ``send_failed`` event per retry and an ``envelope_dead`` at the end. Only
  such errors count: Redis refusing as a whole (unreachable, OOM, READONLY) is
  an outage that pauses dispatch and never dead-letters (scenarios 3, 12, 13).

The rest of each batch goes through, and the dead letters are visible in the admin.
"""

import pytest
from django.test import Client
from django.urls import reverse

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120), pytest.mark.version_dependent]


def test_poison_is_dead_lettered_with_its_reason_and_the_batch_continues(shared_stack, django_user_model):
    stack = shared_stack
    ids = stack.submit(106, prefix="s8")
    garbled, retired, good = ids[10:13], ids[50:53], [i for i in ids if i not in ids[10:13] + ids[50:53]]
    stack.sql("UPDATE dispatch_app_job SET payload = '{\"asset\": 42}'::jsonb WHERE id = ANY(%s)", [garbled])
    stack.sql("UPDATE dispatch_app_job SET domain = 'retired_domain' WHERE id = ANY(%s)", [retired])
    stack.sql(
        "UPDATE dispatch_app_dispatchenvelope SET domain = 'retired_domain', queue = 'retired_domain' "
        "WHERE job_id = ANY(%s)",
        [retired],
    )

    # One batch holds all of them: poison and good rows are claimed together.
    dispatcher = stack.dispatcher("--batch-size", "200")
    worker = stack.worker("delivery")
    stack.wait_all("dispatched", 103, timeout=30, what="envelopes")
    stack.wait_all("succeeded", 100, timeout=60)
    stack.wait_all("failed", 6, timeout=30)
    assert dispatcher.stop() == 0, dispatcher.output()
    worker.stop()

    dead = stack.sql(
        "SELECT job_id, send_attempts, last_error FROM dispatch_app_dispatchenvelope WHERE status = 'dead' "
        "ORDER BY job_id"
    )
    assert [row[0] for row in dead] == retired
    assert all(row[1] == 1 and "'retired_domain' is not registered" in row[2] for row in dead), dead
    failed = dict(stack.sql("SELECT id, error FROM dispatch_app_job WHERE status = 'failed'"))
    for job_id in retired:
        assert failed[job_id].startswith("dispatch failed: domain 'retired_domain' is not registered"), failed
    for job_id in garbled:
        assert "payload rejected: delivery.asset: expected string, got int" in failed[job_id], failed
    # The garbled jobs reached the worker once each, and no other job was disturbed.
    assert stack.count_envelopes("dispatched") == 103
    report = invariants.check_stack(stack, expected_jobs=106, expect_status={"succeeded": 100, "failed": 6})
    # The work of a job whose payload was refused never ran; every good job's ran once.
    assert set(stack.ledger()) == {(job_id, 1) for job_id in good}

    # Visible in the admin: the dead envelopes, filtered by status, with their reason.
    admin_user = django_user_model.objects.create_superuser("ops", "ops@example.invalid", "pw-not-secret-123")
    client = Client()
    client.force_login(admin_user)
    response = client.get(reverse("admin:dispatch_app_dispatchenvelope_changelist") + "?status__exact=dead")
    assert response.status_code == 200
    page = response.content.decode()
    assert "is not registered" in page
    for job_id in retired:
        assert f"/admin/dispatch_app/job/{job_id}/" in page or f">{job_id}<" in page

    record_figures(
        "08_poison_envelopes",
        **report.figures(),
        dead_lettered=len(dead),
        payload_rejected=len(garbled),
        good_jobs_delivered=100,
    )


def test_unsendable_envelopes_are_dead_after_max_send_attempts(private_redis_stack, private_redis):
    stack = private_redis_stack
    private_redis.client().set("rq:queue:delivery", "not a list")
    ids = stack.submit(5, prefix="unsendable")
    dispatcher = stack.dispatcher(
        "--poll-interval",
        "0.2",
        DISPATCH_MAX_SEND_ATTEMPTS=3,
        DISPATCH_SEND_BACKOFF_BASE=0.1,
        DISPATCH_SEND_BACKOFF_MAX=0.2,
    )
    stack.wait_all("dead", 5, timeout=30, what="envelopes")
    assert dispatcher.stop() == 0, dispatcher.output()

    rows = stack.sql("SELECT send_attempts, last_error FROM dispatch_app_dispatchenvelope")
    assert all(attempts == 3 for attempts, _ in rows), rows
    assert all(error.startswith("ResponseError: WRONGTYPE queue key rq:queue:delivery") for _, error in rows), rows
    assert private_redis.client().keys("rq:job:*") == [], "a refused job left no hash behind"
    events = dict(stack.sql("SELECT kind, count(*) FROM dispatch_app_jobevent GROUP BY kind"))
    assert events == {"send_failed": 2 * 5, "envelope_dead": 5}, events
    errors = [r[0] for r in stack.sql("SELECT error FROM dispatch_app_job WHERE id = ANY(%s)", [ids])]
    assert all(e.startswith("dispatch failed: ") for e in errors), errors
    invariants.check_stack(stack, expected_jobs=5, expect_status={"failed": 5})
