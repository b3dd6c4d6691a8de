"""The operators' admin: staff only, each action behind its permission, state changed only through the outbox."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.models import DispatchEnvelope, Job, JobEvent, RecoveryRound
from dispatch_app.outbox.submit import submit
from dispatch_app.rq.publish import rq_job_id
from tests.factories import PAYLOADS
from tests.integration.opsdata import attempt_row, envelope, job

pytestmark = pytest.mark.version_dependent

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
    for url in (JOBS, ENVELOPES, DASHBOARD, timeline_url(j.pk)):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url
    User.objects.create_user("customer", password="pw", is_staff=False)
    client.login(username="customer", password="pw")
    for url in (JOBS, DASHBOARD, timeline_url(j.pk)):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url


@pytest.mark.django_db
def test_staff_without_the_dashboard_permission_is_refused(client):
    client.force_login(staff("viewer", "dispatch_app.view_job"))
    assert client.get(JOBS).status_code == 200
    assert client.get(DASHBOARD).status_code == 403
    # django-rq's own views are not mounted at all (they read RQ hashes with pickle: test_admin_no_pickle.py).
    assert client.get("/admin/django_rq/dashboard/").status_code == 404


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
    confirm = {"action": "cancel", "_selected_action": [j.pk], "confirmed": "yes", "reason": "customer left"}
    client.post(JOBS, confirm, follow=True)
    j.refresh_from_db()
    assert j.status == "cancelled" and j.finished_at is not None
    event = JobEvent.objects.get(job=j, kind="operator_cancel")
    assert "canceller" in event.reason and event.data == {"previous_status": "submitted"}
    assert event.actor == "canceller" and "customer left" in event.reason


@pytest.mark.django_db
def test_retry_now_goes_through_the_outbox(client):
    backing_off = job("delivery", "submitted")
    env = envelope(backing_off, "pending", available_ago=-300, send_attempts=2, last_error="timeout")
    stuck = job("delivery", "queued", dispatched_ago=3600)
    envelope(stuck, "dispatched", dispatched_ago=3600)
    client.force_login(staff("retrier", *VIEW, "dispatch_app.retry_job"))
    selected = {"action": "retry_now", "_selected_action": [backing_off.pk, stuck.pk]}
    client.post(JOBS, selected, follow=True)  # the confirmation page: nothing changes yet
    assert Job.objects.get(pk=stuck.pk).attempt == 1
    client.post(JOBS, {**selected, "confirmed": "yes"}, follow=True)

    env.refresh_from_db()
    assert env.status == "pending" and env.send_attempts == 2
    from dispatch_app.db.clock import db_now

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
def test_timeline_shows_each_attempt_with_its_own_stages_and_each_recovery_decision(client):
    j = job("delivery", "succeeded", attempt=2, submitted_ago=600, dispatched_ago=590, started_ago=100, finished_ago=40)
    # Attempt 1 started on a worker that died; recovery re-dispatched it as attempt 2 after a 30 s backoff.
    attempt_row(
        j,
        1,
        created_ago=600,
        dispatched_ago=590,
        started_ago=500,
        finished_ago=200,
        outcome="superseded",
        worker="host-a.17",
        with_envelope=False,
    )
    attempt_row(
        j,
        2,
        created_ago=200,
        due_ago=170,
        dispatched_ago=150,
        started_ago=100,
        finished_ago=40,
        outcome="succeeded",
        worker="host-b.4",
        with_envelope=False,
    )
    envelope(j, "dispatched", attempt=1, created_ago=600, dispatched_ago=590, send_attempts=2, last_error="")
    envelope(j, "dispatched", attempt=2, created_ago=200, dispatched_ago=150)
    JobEvent.objects.create(job=j, attempt=1, kind="send_failed", reason="ConnectionError: redis down")
    JobEvent.objects.create(
        job=j, attempt=1, kind="recovery_redispatch", reason="running on a dead worker", data={"next_attempt": 2}
    )
    JobEvent.objects.create(job=j, attempt=2, kind="recovery_left_alone", reason="worker heartbeat is fresh")
    RecoveryRound.objects.create(domain="delivery", scanned=1, redispatched=1)
    client.force_login(staff("viewer", *VIEW))
    page = client.get(timeline_url(j.pk)).content.decode()

    for text in (
        "submitted",
        "attempt 1: envelope created",
        "attempt 1: dispatched to RQ",
        "attempt 1: started on host-a.17",  # the earlier attempt's start stays on the page
        "attempt 1: superseded by attempt 2",
        "attempt 2: created",
        "attempt 2: due (its delay is over)",
        "attempt 2: dispatched to RQ",
        "attempt 2: started on host-b.4",
        "attempt 2: finished: succeeded",
        "replaced by recovery_redispatch: running on a dead worker",
        "recovery_left_alone",
        "worker heartbeat is fresh",
        "ConnectionError: redis down",
        "backoff (created → due)",
        "outbox (due → dispatched)",
        "RQ queue (dispatched → started)",
        "worker (started → finished)",
    ):
        assert text in page, text

    def stage_times(attempt: int) -> list[str]:
        section = page.split(f'id="pf-attempt-{attempt}"')[1].split("</table>")[0]
        return [
            re.sub(r"<[^>]+>", "", cell).strip()
            for cell in re.findall(r"<tr class=\"pf-stage-\w+\">.*?</tr>", section, re.S)
            for cell in [cell.split("<td>")[-1]]
        ]

    # Each attempt's stages from its own timestamps; never "dispatched first → started last" (490 s = 8.2 min).
    assert stage_times(1) == ["–", "10.0 s", "90.0 s", "5.0 min (cut short: superseded)"]
    assert stage_times(2) == ["30.0 s", "20.0 s", "50.0 s", "60.0 s"]
    assert "8.2 min" not in page
    assert '<strong id="pf-stage">finished</strong>' in page


@pytest.mark.django_db
def test_timeline_shows_the_exception_class_and_a_collapsible_traceback_per_attempt(client):
    j = job("image_series", "failed", submitted_ago=60, started_ago=50, finished_ago=40)
    error = (
        "dispatch_app.domains.providers.ProviderError: vendor said 503\n\n"
        'Traceback (most recent call last):\n  File "dispatch_app/execution.py", line 1, in execute\nProviderError'
    )
    attempt_row(j, 1, created_ago=60, dispatched_ago=55, started_ago=50, finished_ago=40, outcome="failed", error=error)
    client.force_login(staff("viewer", *VIEW))
    page = client.get(timeline_url(j.pk)).content.decode()
    assert (
        '<strong class="pf-error-class">dispatch_app.domains.providers.ProviderError</strong>: vendor said 503' in page
    )
    assert '<details class="pf-traceback"><summary>traceback</summary><pre>Traceback (most recent call last):' in page


@pytest.mark.django_db
def test_the_job_list_shows_the_current_attempts_stages(client):
    retried = job("delivery", "running", attempt=2, submitted_ago=900, dispatched_ago=890, started_ago=30)
    attempt_row(retried, 1, created_ago=900, dispatched_ago=890, finished_ago=200, outcome="superseded")
    attempt_row(retried, 2, created_ago=200, due_ago=100, dispatched_ago=95, started_ago=30)
    backing_off = job("delivery", "submitted", attempt=2, submitted_ago=900)
    attempt_row(backing_off, 1, created_ago=900, dispatched_ago=899, finished_ago=60, outcome="superseded")
    attempt_row(backing_off, 2, created_ago=60, due_ago=-600)
    envelope(backing_off, "pending", attempt=2, created_ago=60, available_ago=-600)
    client.force_login(staff("viewer", *VIEW))
    page = client.get(JOBS).content.decode()

    def row(job_row):
        html = page.split(f"/job/{job_row.pk}/timeline/")[0].rsplit("<tr", 1)[1]
        return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>.*?</t[dh]>", html, re.S)]

    # id, domain, status, waiting in, attempt, age, backoff, outbox, RQ queue, worker
    cells = row(retried)
    assert cells[3] == "worker" and cells[6:9] == ["100.0 s", "5.0 s", "65.0 s"]
    assert cells[9].endswith("so far") and "14.8 min" not in page  # not first dispatch -> this start
    cells = row(backing_off)
    assert cells[3].startswith("backoff: backoff before retry 1 (attempt 2): due in 10.0 min") or cells[3].startswith(
        "backoff: backoff before retry 1 (attempt 2): due in 9.9"
    ), cells[3]
    assert cells[6].endswith("so far") and cells[7] == "–"


@pytest.mark.django_db
def test_searching_a_number_finds_that_job_only(client):
    five = None
    for _ in range(6):
        five = job("delivery", "succeeded")
    others = [job("image_series", "running") for _ in range(3)]
    for index, other in enumerate(others):
        Job.objects.filter(pk=other.pk).update(vendor_request_id=f"req-{five.pk}{index}")
    client.force_login(staff("viewer", *VIEW))
    page = client.get(JOBS, {"q": str(five.pk)}).content.decode()
    assert f"/job/{five.pk}/timeline/" in page
    assert not any(f"/job/{other.pk}/timeline/" in page for other in others)
    page = client.get(JOBS, {"q": f"req-{five.pk}"}).content.decode()  # text still searches vendor request ids
    assert all(f"/job/{other.pk}/timeline/" in page for other in others)


@pytest.mark.django_db
def test_the_admin_change_pages_print_instants_like_the_operator_pages(client):
    j = job("delivery", "queued", updated_ago=30, submitted_ago=60)
    client.force_login(staff("operator", *VIEW))
    submitted = Job.objects.get(pk=j.pk).submitted_at
    page = client.get(f"{JOBS}{j.pk}/change/").content.decode()
    assert submitted.strftime("%Y-%m-%d %H:%M:%S UTC") in page
    assert "a.m." not in page and "p.m." not in page
    env = envelope(j, created_ago=50)
    page = client.get(f"{ENVELOPES}{env.pk}/change/").content.decode()
    assert env.created_at.strftime("%Y-%m-%d %H:%M:%S UTC") in page
