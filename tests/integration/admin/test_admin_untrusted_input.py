"""What a browser can send never makes the admin fail (issue 26.5): ids parsed strictly, NUL refused with a
message, cancel and pause/resume confirmed with a reason, and the audit kept when the operator's user is gone."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User

from dispatch_app.actions import operator as actions
from dispatch_app.models import DispatchEnvelope, DomainPause, DomainPauseEvent, Job, JobEvent
from tests.integration.opsdata import envelope, job

JOBS = "/admin/dispatch_app/job/"
ENVELOPES = "/admin/dispatch_app/dispatchenvelope/"
PAUSE = "/admin/dispatch_app/job/dashboard/pause/"

pytestmark = [pytest.mark.django_db, pytest.mark.version_dependent]


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("op", password="pw"))
    return client


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


@pytest.mark.parametrize(
    "query",
    [
        "q=%C2%B2",
        "q=%D9%A3",
        "q=99999999999999999999999",
        "recovery=%C2%B2:failed",
        "recovery=1:nope",
        "recovery=99999999999999999999999:failed",
        "q=%231",
        "p=%C2%B2",
        "o=%C2%B2",
        "older_than=%C2%B2",
        "error=%C2%B2",
        "worker=%F0%9F%92%A5",
    ],
)
def test_odd_ids_in_the_query_are_not_errors(operator, query):
    j = job("delivery", "submitted")
    response = operator.get(f"{JOBS}?{query}")
    assert response.status_code == 200
    if query == "q=%231":  # "#1": still a job id search
        assert (f">{j.pk}<" in response.content.decode()) == (j.pk == 1)


@pytest.mark.parametrize(
    "url",
    [JOBS + "?worker=%00", JOBS + "?q=a%00b", JOBS + "?domain__exact=%00", ENVELOPES + "?q=%00", JOBS + "?%00=1"],
)
def test_a_nul_in_a_query_is_refused_with_a_message(operator, url):
    response = operator.get(url, follow=True)
    assert response.status_code == 200
    assert response.redirect_chain and response.redirect_chain[-1][0] == url.split("?")[0]
    assert any("NUL character" in m for m in messages_of(response))


def test_a_selected_row_that_is_not_an_id_is_refused_and_nothing_is_done(operator):
    j = job("delivery", "failed", finished_ago=10)
    for bad in ("%C2%B2", "²", "1e3", " "):
        response = operator.post(JOBS, {"action": "retry_now", "_selected_action": [j.pk, bad]}, follow=True)
        assert response.status_code == 200
        assert any("not a valid id" in m for m in messages_of(response))
    response = operator.post(
        JOBS, {"action": "cancel", "_selected_action": [str(j.pk), "²"], "confirmed": "yes", "reason": "x"}, follow=True
    )
    assert any("not a valid id" in m for m in messages_of(response))
    assert Job.objects.get(pk=j.pk).attempt == 1 and not JobEvent.objects.exists()


def test_a_nul_in_a_pause_reason_is_refused(operator):
    response = operator.post(
        PAUSE, {"domain": "delivery", "op": "pause", "reason": "a\x00b", "confirmed": "yes"}, follow=True
    )
    assert response.status_code == 200 and any("NUL character" in m for m in messages_of(response))
    assert not DomainPause.objects.exists() and not DomainPauseEvent.objects.exists()
    response = operator.post(PAUSE, {"domain": "nope", "op": "pause", "reason": "x", "confirmed": "yes"}, follow=True)
    assert any("unknown domain 'nope'" in m for m in messages_of(response))


def test_retry_now_refuses_a_cancelled_job_before_any_write():
    j = job("delivery", "submitted")
    env = envelope(j, "pending", available_ago=-600)  # waiting 10 min for its time
    assert actions.cancel_job(j.pk).applied
    before = DispatchEnvelope.objects.get(pk=env.pk).available_at
    events = JobEvent.objects.count()
    outcome = actions.retry_job_now(j.pk)
    assert not outcome.applied and "cancelled" in outcome.message
    assert DispatchEnvelope.objects.get(pk=env.pk).available_at == before
    assert JobEvent.objects.count() == events and not LogEntry.objects.exists()


def test_cancel_asks_for_a_reason_and_acts_on_exactly_the_jobs_it_listed(operator):
    shown = [job("delivery", "submitted") for _ in range(2)]
    page = operator.post(JOBS + "?domain__exact=delivery", {"action": "cancel", "_selected_action": [shown[0].pk]})
    text = page.content.decode()
    assert page.status_code == 200 and 'id="pf-confirm-cancel"' in text and 'value="Yes, cancel 1 job"' in text
    assert f'value="{shown[1].pk}"' not in text
    assert Job.objects.filter(status="cancelled").count() == 0  # nothing before the confirmation

    # A confirmation without a reason: the page again, with the error, nothing done.
    base = {"action": "cancel", "_selected_action": [shown[0].pk], "confirmed": "yes"}
    again = operator.post(JOBS, {**base, "reason": "  "})
    assert "A reason is required." in again.content.decode()
    assert Job.objects.filter(status="cancelled").count() == 0

    # select_across=1 on the confirming POST (all jobs in the filter): still only the job the page listed.
    joined = job("delivery", "submitted")  # appeared in the filter after the page was shown
    operator.post(JOBS + "?domain__exact=delivery", {**base, "select_across": "1", "reason": "duplicate"})
    assert list(Job.objects.filter(status="cancelled").values_list("pk", flat=True)) == [shown[0].pk]
    assert Job.objects.get(pk=joined.pk).status == "submitted"
    event = JobEvent.objects.get(kind="operator_cancel")
    assert event.actor == "op" and event.reason == "by op: duplicate"


def test_select_across_on_the_first_post_lists_every_job_it_would_cancel(operator):
    jobs = [job("agent", "submitted") for _ in range(3)]
    page = operator.post(
        JOBS + "?domain__exact=agent", {"action": "cancel", "select_across": "1", "_selected_action": [jobs[0].pk]}
    )
    text = page.content.decode()
    assert 'value="Yes, cancel 3 jobs"' in text and all(f'value="{j.pk}"' in text for j in jobs)
    assert Job.objects.filter(status="cancelled").count() == 0


def test_pause_and_resume_are_confirmed_with_a_reason_and_audited(operator):
    j = job("agent", "submitted")
    envelope(j, "pending")
    page = operator.post(PAUSE, {"domain": "agent", "op": "pause"})
    text = page.content.decode()
    assert page.status_code == 200 and 'id="pf-confirm-pause"' in text and "Pause dispatch of agent?" in text
    assert not DomainPause.objects.exists()
    again = operator.post(PAUSE, {"domain": "agent", "op": "pause", "confirmed": "yes", "reason": ""})
    assert "A reason is required." in again.content.decode() and not DomainPause.objects.exists()

    operator.post(PAUSE, {"domain": "agent", "op": "pause", "confirmed": "yes", "reason": "vendor down"})
    assert DomainPause.objects.get().reason == "vendor down"
    page = operator.post(PAUSE, {"domain": "agent", "op": "resume"})
    assert 'id="pf-confirm-resume"' in page.content.decode() and DomainPause.objects.exists()
    operator.post(PAUSE, {"domain": "agent", "op": "resume", "confirmed": "yes", "reason": "vendor back"})
    assert not DomainPause.objects.exists()
    trail = list(DomainPauseEvent.objects.order_by("id").values_list("domain", "op", "actor", "reason"))
    assert trail == [("agent", "pause", "op", "vendor down"), ("agent", "resume", "op", "vendor back")]


def test_the_audit_trail_survives_the_deletion_of_the_operators_user(client):
    user = User.objects.create_superuser("leaver", password="pw")
    j = job("delivery", "failed", finished_ago=10)
    c = job("delivery", "submitted")
    assert actions.retry_job_now(j.pk, user=user).applied
    assert actions.cancel_job(c.pk, user=user, reason="test order").applied
    assert actions.pause_domain("delivery", user=user, reason="incident").applied
    assert LogEntry.objects.filter(user=user).count() == 3
    user.delete()
    assert not LogEntry.objects.exists()  # Django's admin log goes with the user (its foreign key cascades) ...
    kept = set(JobEvent.objects.filter(actor="leaver").values_list("job_id", "kind"))
    assert kept == {(j.pk, "operator_redispatch"), (c.pk, "operator_cancel")}  # ... the job events keep the name
    assert DomainPauseEvent.objects.get().actor == "leaver"


def test_a_timeline_of_an_id_beyond_bigint_is_a_404(operator):
    assert operator.get(f"{JOBS}99999999999999999999999/timeline/").status_code == 404


def test_a_bulk_retry_warns_about_no_worker_a_pause_and_a_shared_error_and_its_message_is_summarised(
    operator, redis_conn
):
    from dispatch_app.admin.common import REPORT_LINES

    ids = [job("delivery", "failed", finished_ago=10).pk for _ in range(12)]
    Job.objects.filter(pk__in=ids).update(error="ProviderError: 503 vendor down\n\nTraceback ...")
    actions.pause_domain("delivery", reason="vendor incident")
    page = operator.post(JOBS, {"action": "retry_now", "_selected_action": ids}).content.decode()
    warnings = page.split('class="pf-confirm-warnings"')[1].split("</ul>")[0]
    assert "No live worker serves queue delivery" in warnings
    assert "Dispatch of delivery is paused (by system: vendor incident)" in warnings
    assert "All 12 selected jobs last failed with the same error: ProviderError: 503 vendor down" in warnings

    response = operator.post(JOBS, {"action": "retry_now", "_selected_action": ids, "confirmed": "yes"}, follow=True)
    (message,) = messages_of(response)
    assert message.startswith("12 done: job ") and f"… and {12 - REPORT_LINES} more" in message
    assert message.count("re-dispatched as attempt 2") == REPORT_LINES
