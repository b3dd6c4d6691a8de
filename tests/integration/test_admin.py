"""The operators' admin: staff only, each action behind its permission, state changed only through the outbox."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from dispatch_app.conf import dispatch_settings
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.publisher import rq_job_id
from dispatch_app.models import DispatchEnvelope, Job, JobEvent, RecoveryRound
from dispatch_app.outbox import submit
from tests.factories import PAYLOADS
from tests.integration.opsdata import envelope, job

JOBS = "/admin/dispatch_app/job/"
ENVELOPES = "/admin/dispatch_app/dispatchenvelope/"
DASHBOARD = "/admin/dispatch_app/job/dashboard/"


def timeline_url(job_id: int) -> str:
    return f"/admin/dispatch_app/job/{job_id}/timeline/"


def staff(username="operator", *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return User.objects.get(pk=user.pk)  # fresh permission cache


VIEW = ("dispatch_app.view_job", "dispatch_app.view_dispatchenvelope", "dispatch_app.view_dispatch_dashboard")


@pytest.mark.django_db
def test_pages_render_for_staff_with_real_data(client):
    waiting = job("delivery", "submitted", updated_ago=120, submitted_ago=120)
    envelope(waiting, "pending", created_ago=120)
    fresh = job("delivery", "submitted")
    dead = job("agent", "failed")
    envelope(dead, "dead", send_attempts=8, last_error="ConnectionError: refused")
    client.force_login(staff("operator", *VIEW))

    page = client.get(JOBS).content.decode()
    assert f">{waiting.pk}<" in page and "outbox" in page and "timeline" in page and "Dispatch dashboard" in page
    page = client.get(JOBS + "?stage=outbox&older_than=1m&domain=delivery").content.decode()
    assert f"/job/{waiting.pk}/timeline/" in page and f"/job/{fresh.pk}/timeline/" not in page
    page = client.get(ENVELOPES + "?status=dead").content.decode()
    assert "ConnectionError: refused" in page
    page = client.get(DASHBOARD).content.decode()
    assert 'id="pf-domain-delivery"' in page and "<svg" in page and "Dispatcher processes" in page
    assert client.get(timeline_url(waiting.pk)).status_code == 200


@pytest.mark.django_db
def test_anonymous_and_non_staff_are_refused(client):
    j = job()
    for url in (JOBS, ENVELOPES, DASHBOARD, timeline_url(j.pk), "/admin/django_rq/dashboard/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url
    User.objects.create_user("customer", password="pw", is_staff=False)
    client.login(username="customer", password="pw")
    for url in (JOBS, DASHBOARD, timeline_url(j.pk)):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url


@pytest.mark.django_db
def test_staff_without_the_dashboard_or_rq_permission_is_refused(client):
    client.force_login(staff("viewer", "dispatch_app.view_job"))
    assert client.get(JOBS).status_code == 200
    assert client.get(DASHBOARD).status_code == 403
    # django-rq's own views can requeue/delete RQ jobs: a dedicated permission only.
    assert client.get("/admin/django_rq/dashboard/").status_code == 403
    client.force_login(staff("rq-operator", "django_rq.admin"))
    assert client.get("/admin/django_rq/dashboard/").status_code == 200


@pytest.mark.django_db
def test_an_action_needs_its_own_permission(client):
    j = job("delivery", "submitted")
    envelope(j, "pending")
    client.force_login(staff("viewer", *VIEW, "dispatch_app.retry_job"))
    response = client.post(JOBS, {"action": "cancel", "_selected_action": [j.pk]}, follow=True)
    assert response.status_code == 200
    j.refresh_from_db()
    assert j.status == "submitted" and not JobEvent.objects.filter(kind="operator_cancel").exists()

    client.force_login(staff("canceller", *VIEW, "dispatch_app.cancel_job"))
    client.post(JOBS, {"action": "cancel", "_selected_action": [j.pk]}, follow=True)
    j.refresh_from_db()
    assert j.status == "cancelled" and j.finished_at is not None
    event = JobEvent.objects.get(job=j, kind="operator_cancel")
    assert "canceller" in event.reason and event.data == {"previous_status": "submitted"}


@pytest.mark.django_db
def test_retry_now_goes_through_the_outbox(client):
    backing_off = job("delivery", "submitted")
    env = envelope(backing_off, "pending", available_ago=-300, send_attempts=2, last_error="timeout")
    stuck = job("delivery", "queued", dispatched_ago=3600)
    envelope(stuck, "dispatched", dispatched_ago=3600)
    client.force_login(staff("retrier", *VIEW, "dispatch_app.retry_job"))
    client.post(JOBS, {"action": "retry_now", "_selected_action": [backing_off.pk, stuck.pk]}, follow=True)

    env.refresh_from_db()
    assert env.status == "pending" and env.send_attempts == 2
    from dispatch_app.dbtime import db_now

    assert env.available_at <= db_now()
    stuck.refresh_from_db()
    assert stuck.attempt == 2 and stuck.status == "submitted"
    new = DispatchEnvelope.objects.get(job=stuck, attempt=2)
    assert new.status == "pending" and new.send_attempts == 0
    assert JobEvent.objects.get(job=stuck, kind="operator_redispatch").data["next_attempt"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_rearmed_dead_envelope_is_dispatched_by_the_dispatcher(client, redis_conn):
    conf = dispatch_settings()
    j = submit("delivery", PAYLOADS["delivery"])
    env = DispatchEnvelope.objects.get(job=j)
    # Dead-lettered the way the dispatcher does it: envelope dead, job failed.
    DispatchEnvelope.objects.filter(pk=env.pk).update(status="dead", send_attempts=8, last_error="refused")
    Job.objects.filter(pk=j.pk).update(status="failed", error="dispatch failed: refused")

    client.force_login(staff("viewer", *VIEW, "dispatch_app.retry_envelope"))
    client.post(ENVELOPES, {"action": "rearm", "_selected_action": [env.pk]}, follow=True)
    env.refresh_from_db()
    assert env.status == "dead"  # no rearm permission: nothing changed

    client.force_login(staff("rearmer", *VIEW, "dispatch_app.rearm_envelope"))
    client.post(ENVELOPES, {"action": "rearm", "_selected_action": [env.pk]}, follow=True)
    env.refresh_from_db()
    j.refresh_from_db()
    assert (env.status, env.send_attempts, j.status, j.attempt) == ("pending", 0, "submitted", 1)
    assert redis_conn.exists(f"rq:job:{rq_job_id(j.pk, 1)}") == 0  # the admin pushed nothing to RQ

    loop = DispatchLoop(conf)
    try:
        result = loop.run_once("notify")
    finally:
        loop.close()
    assert result.dispatched == 1
    env.refresh_from_db()
    j.refresh_from_db()
    assert env.status == "dispatched" and j.status == "queued"
    assert redis_conn.exists(f"rq:job:{rq_job_id(j.pk, 1)}") == 1
    assert JobEvent.objects.get(job=j, kind="operator_rearm").data["previous_error"] == "refused"


@pytest.mark.django_db
def test_rearm_is_refused_when_the_job_moved_on(client):
    j = job("delivery", "cancelled")
    env = envelope(j, "dead", last_error="refused")
    client.force_login(staff("rearmer", *VIEW, "dispatch_app.rearm_envelope"))
    client.post(ENVELOPES, {"action": "rearm", "_selected_action": [env.pk]}, follow=True)
    env.refresh_from_db()
    assert env.status == "dead"


@pytest.mark.django_db
def test_timeline_shows_every_stage_and_each_recovery_decision_with_its_reason(client):
    j = job("delivery", "succeeded", attempt=2, submitted_ago=600, dispatched_ago=590, started_ago=100, finished_ago=40)
    envelope(j, "dispatched", attempt=1, created_ago=600, dispatched_ago=590, send_attempts=2, last_error="")
    envelope(j, "dispatched", attempt=2, created_ago=200, dispatched_ago=150)
    JobEvent.objects.create(job=j, attempt=1, kind="send_failed", reason="ConnectionError: redis down")
    JobEvent.objects.create(
        job=j, attempt=1, kind="recovery_redispatch", reason="queued for 300 s with no RQ job", data={"next_attempt": 2}
    )
    JobEvent.objects.create(job=j, attempt=2, kind="recovery_left_alone", reason="worker heartbeat is fresh")
    RecoveryRound.objects.create(domain="delivery", scanned=1, redispatched=1)
    client.force_login(staff("viewer", *VIEW))
    page = client.get(timeline_url(j.pk)).content.decode()

    for text in (
        "submitted",
        "attempt 1: envelope created",
        "attempt 1: dispatched to RQ",
        "attempt 2: envelope created",
        "attempt 2: dispatched to RQ",
        "dispatched (first)",
        "started (attempt 2)",
        "finished: succeeded",
        "recovery_redispatch",
        "queued for 300 s with no RQ job",
        "recovery_left_alone",
        "worker heartbeat is fresh",
        "ConnectionError: redis down",
        "outbox (submitted → dispatched)",
        "RQ queue (dispatched → started)",
        "worker (started → finished)",
    ):
        assert text in page, text
    # Time in each stage from the database timestamps: 10 s in the outbox, 490 s in the queue, 60 s running.
    assert "10.0 s" in page and "8.2 min" in page and "60.0 s" in page
    assert '<strong id="pf-stage">finished</strong>' in page
