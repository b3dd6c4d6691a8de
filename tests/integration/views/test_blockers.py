"""Every wait names its blocker (issue 28.4): the job list's "waiting in" says behind what, the timeline too."""

from __future__ import annotations

import html
import re
import uuid

import pytest
from django.contrib.auth.models import User

from dispatch_app.actions import operator as actions
from dispatch_app.models import DispatcherProcess, JobEvent
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.timeline import stage_sql
from tests.integration.opsdata import ago, attempt_row, envelope, job, sql

JOBS = "/admin/dispatch_app/job/"
pytestmark = [pytest.mark.django_db, pytest.mark.version_dependent]


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("op", password="pw"))
    return client


def waiting_cell(page: str, job_id: int) -> str:
    row = page.split(f"/job/{job_id}/timeline/")[0].rsplit("<tr", 1)[1]
    cell = re.search(r'<td class="field-waiting_in">(.*?)</td>', row, re.S).group(1)
    return html.unescape(re.sub(r"<[^>]+>", "", cell).strip())


def test_the_list_names_each_outbox_blocker(operator):
    DispatcherProcess.objects.create(name="h:1:live", hostname="h", pid=1)  # a live dispatcher
    paused = job("agent", "submitted")
    envelope(paused, "pending")
    actions.pause_domain("agent", reason="vendor down")
    retry = job("delivery", "submitted", attempt=3)
    envelope(retry, "pending", attempt=3, available_ago=-42)
    send_retry = job("delivery", "submitted")
    envelope(send_retry, "pending", available_ago=-20, send_attempts=2, last_error="ConnectionError: refused")
    scheduled = job("delivery", "submitted")
    envelope(scheduled, "pending", available_ago=-3600)
    leased = job("delivery", "submitted")
    env = envelope(leased, "pending", available_ago=-25)
    sql("UPDATE dispatch_app_dispatchenvelope SET lease_token = %s WHERE id = %s", [uuid.uuid4(), env.pk])
    dead = job("delivery", "submitted")
    envelope(dead, "dead", last_error="domain 'x' is not registered")
    due = job("delivery", "submitted")
    envelope(due, "pending")
    spread = job("delivery", "submitted", attempt=2)  # recovery's round spreads its re-dispatches
    envelope(spread, "pending", attempt=2, available_ago=-7)
    JobEvent.objects.create(job=spread, attempt=1, kind="recovery_redispatch", reason="lost")

    page = operator.get(JOBS).content.decode()
    assert waiting_cell(page, paused.pk).startswith("outbox: dispatch of its domain paused by system")
    assert "vendor down" in waiting_cell(page, paused.pk)
    assert re.match(
        r"(outbox|backoff): backoff before retry 2 \(attempt 3\): due in (42|41)\.\d s", waiting_cell(page, retry.pk)
    )
    assert re.match(
        r"outbox: send backoff after 2 failed send\(s\): due in \d+\.\d s; last error: Conn",
        waiting_cell(page, send_retry.pk),
    )
    assert waiting_cell(page, scheduled.pk).startswith(
        "outbox: scheduled: due in 60.0 min"
    ) or "59.9 min" in waiting_cell(page, scheduled.pk)
    assert re.match(
        r"outbox: being sent by a dispatcher \(its lease ends in \d+\.\d s\)", waiting_cell(page, leased.pk)
    )
    assert "envelope dead (domain 'x' is not registered)" in waiting_cell(page, dead.pk)
    assert "waiting for a dispatcher's claim" in waiting_cell(page, due.pk)
    assert re.match(
        r"(outbox|backoff): re-dispatched by recovery, spread over its round \(attempt 2\): due in [67]\.\d s",
        waiting_cell(page, spread.pk),
    )

    DispatcherProcess.objects.all().delete()  # nobody to send it
    page = operator.get(JOBS).content.decode()
    assert "due, and no live dispatcher to send it" in waiting_cell(page, due.pk)


def test_the_timeline_names_the_pause_shows_it_as_its_own_stage_and_lists_pause_and_resume(operator):
    j = job("agent", "submitted", submitted_ago=100)
    sql(f"UPDATE dispatch_app_jobattempt SET created_at = {ago(100)} WHERE job_id = %s", [j.pk])
    envelope(j, "pending", created_ago=100)
    actions.pause_domain("agent", reason="vendor down")
    sql(f"UPDATE dispatch_app_domainpauseevent SET at = {ago(60)}")  # paused 60 s ago
    page = operator.get(f"{JOBS}{j.pk}/timeline/").content.decode()
    blocker = re.search(r'<span id="pf-blocker" data-kind="paused" class="pf-red">(.*?)</span>', page, re.S)
    assert blocker and "paused by system" in blocker.group(1) and "vendor down" in blocker.group(1)
    paused_row = re.search(r'<tr class="pf-stage-paused">.*?</tr>', page, re.S).group(0)
    assert re.search(r"<td>(59|60)\.\d s</td>", paused_row), paused_row
    assert "dispatch of agent paused" in page

    actions.resume_domain("agent", reason="vendor back")
    page = operator.get(f"{JOBS}{j.pk}/timeline/").content.decode()
    assert "dispatch of agent resumed" in page and "by system: vendor back" in page
    assert 'data-kind="none"' in page or 'id="pf-blocker"' in page  # no longer "paused"
    assert 'data-kind="paused"' not in page


def test_the_timeline_orders_by_attempt_then_time_shows_future_times_and_has_retry_and_cancel(operator):
    j = job("delivery", "submitted", attempt=2, submitted_ago=50)
    attempt_row(j, 1, created_ago=50, dispatched_ago=49, started_ago=48, finished_ago=40, outcome="superseded")
    attempt_row(j, 2, created_ago=40, due_ago=-30)
    envelope(j, "pending", attempt=2, created_ago=40, available_ago=-30)
    # The retry decision of attempt 1, written in the same instant as attempt 2's envelope (a later id).
    JobEvent.objects.create(job=j, attempt=1, kind="retry_after_failure", reason="vendor 503")
    sql(f"UPDATE dispatch_app_jobevent SET at = {ago(40)} WHERE job_id = %s", [j.pk])
    page = operator.get(f"{JOBS}{j.pk}/timeline/").content.decode()
    entries = page.split('id="pf-entries"')[1]
    assert entries.index("retry_after_failure") < entries.index("attempt 2: envelope created")
    envelopes = page.split('id="pf-envelopes"')[1]
    assert re.search(r"\(in (29|30)\.\d s\)", envelopes)
    assert re.search(r'data-kind="backoff">backoff before retry 1 \(attempt 2\): due in (29|30)\.\d s', page)
    backoff_row = re.search(r'<tr class="pf-stage-backoff">.*?</tr>', page.split('id="pf-stages"')[1], re.S).group(0)
    assert re.search(r"due \d{4}-\d\d-\d\d [\d:.]+ UTC \(in (29|30)\.\d s\)", backoff_row), backoff_row

    # The buttons open the list's confirmation pages for this one job.
    confirm = operator.post(JOBS, {"_selected_action": [j.pk], "action": "cancel"}).content.decode()
    assert 'id="pf-confirm-cancel"' in confirm and 'value="Yes, cancel 1 job"' in confirm
    assert 'id="pf-timeline-retry"' in page and 'id="pf-timeline-cancel"' in page


def test_a_dead_workers_job_says_when_recovery_acts_with_the_setting(operator, redis_conn):
    from rq import Queue
    from rq.serializers import JSONSerializer

    j = job("delivery", "running", dispatched_ago=70, started_ago=60, updated_ago=60)
    q = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    rq_job = q.enqueue("dispatch_app.execution.execute", "delivery", j.pk, 1, job_id=rq_job_id(j.pk, 1))
    redis_conn.hset(rq_job.key, "worker_name", "w-gone")
    sql("UPDATE dispatch_app_jobattempt SET worker = 'w-gone' WHERE job_id = %s", [j.pk])
    page = operator.get(f"{JOBS}{j.pk}/timeline/").content.decode()
    eta = re.search(r'<span id="pf-recovery-eta">(.*?)</span>', page, re.S)
    assert eta, page.split('id="pf-rq-state"')[1][:800] if 'id="pf-rq-state"' in page else "no rq state"
    # delivery's RUNNING_STALE_SECONDS is 300: untouched for 60 s, recovery takes it up in about 4 min.
    assert "RUNNING_STALE_SECONDS = 300 s" in eta.group(1) and re.search(r"in 4\.0 min", eta.group(1))


def test_the_dashboard_names_backoff_and_a_dead_worker_holding_jobs_while_another_worker_lives(operator, redis_conn):
    from rq import Queue, SimpleWorker
    from rq.serializers import JSONSerializer

    from dispatch_app.views import board

    waiting = job("delivery", "submitted", attempt=2)
    envelope(waiting, "pending", attempt=2, available_ago=-45)
    held = job("delivery", "running", dispatched_ago=70, started_ago=60, updated_ago=60)
    attempt_row(held, 1, worker="w-killed", created_ago=80, dispatched_ago=70, started_ago=60, with_envelope=False)
    alive = SimpleWorker(
        [Queue("delivery", connection=redis_conn, serializer=JSONSerializer)],
        connection=redis_conn,
        name="w-alive",
        serializer=JSONSerializer,
    )
    alive.register_birth()

    data = board.build(redis_conn=redis_conn)
    (banner,) = [b for b in data["banners"] if b["key"] == "dead-worker-holds"]
    assert banner["text"].startswith("delivery: 1 running job(s) held by dead worker w-killed")
    assert "RUNNING_STALE_SECONDS = 300 s" in banner["text"] and "worker=w-killed" in banner["link"]
    waits = data["domains"]["delivery"]["waits"]
    assert waits["not_due"] == 1 and 40 < waits["next_due_in"] <= 45

    page = operator.get("/admin/dispatch_app/job/dashboard/live/").content.decode()
    behind = page.split('id="pf-domain-delivery"')[1].split('class="pf-behind">')[1].split("</td>")[0]
    assert "1 in backoff / scheduled" in behind and re.search(r"next due in 4\d\.\d s", behind)

    # The worker holding it is alive: no banner.
    sql("UPDATE dispatch_app_jobattempt SET worker = 'w-alive' WHERE job_id = %s", [held.pk])
    assert not [b for b in board.build(redis_conn=redis_conn)["banners"] if b["key"] == "dead-worker-holds"]
    alive.register_death()


def test_the_rq_stage_list_starts_at_the_queues_head(operator):
    first = job("delivery", "queued", dispatched_ago=30)
    second = job("delivery", "queued", dispatched_ago=20)
    third = job("delivery", "queued", dispatched_ago=10)
    page = operator.get(JOBS + "?stage=rq").content.decode()
    order = [int(i) for i in re.findall(r"/job/(\d+)/timeline/", page)]
    assert order == [first.pk, second.pk, third.pk]
    page = operator.get(JOBS).content.decode()  # elsewhere: newest first
    assert [int(i) for i in re.findall(r"/job/(\d+)/timeline/", page)] == [third.pk, second.pk, first.pk]


def test_the_envelope_list_reads_future_times_as_in_n_s_and_a_dispatched_one_as_sent(operator):
    later = envelope(job("delivery", "submitted"), "pending", available_ago=-90)
    sent = envelope(job("delivery", "queued"), "dispatched", created_ago=30, dispatched_ago=20)
    page = operator.get("/admin/dispatch_app/dispatchenvelope/").content.decode()

    def cell(env):
        row = page.split(f'value="{env.pk}"')[1].split("</tr>")[0]
        return re.search(r'<td class="field-available">(.*?)</td>', row, re.S).group(1)

    assert re.search(r"UTC \(in (89|90)\.\d s\)", cell(later))
    assert cell(sent).startswith("sent ") and "in " not in cell(sent)


def test_paused_time_is_not_outbox_latency_in_the_percentiles_and_charts():
    from django.db import connection

    from dispatch_app.models import DomainPauseEvent

    # Due 100 s before its dispatch; its domain was paused for 80 s of that (from 110 s to 30 s ago).
    j = job("agent", "queued", submitted_ago=120, dispatched_ago=20)
    attempt_row(j, 1, created_ago=120, dispatched_ago=20)
    other = job("delivery", "queued", submitted_ago=120, dispatched_ago=20)  # another domain: not paused
    attempt_row(other, 1, created_ago=120, dispatched_ago=20)
    pause = DomainPauseEvent.objects.create(domain="agent", op="pause", actor="op")
    resume = DomainPauseEvent.objects.create(domain="agent", op="resume", actor="op")
    sql(f"UPDATE dispatch_app_domainpauseevent SET at = {ago(110)} WHERE id = %s", [pause.pk])
    sql(f"UPDATE dispatch_app_domainpauseevent SET at = {ago(30)} WHERE id = %s", [resume.pk])
    with connection.cursor() as cursor:
        rows = {(m, d, s): p for m, d, s, n, p in stage_sql.percentiles(cursor, windows=(5,), qs=(0.5,))}
        charts = stage_sql.per_minute_by_domain(cursor, 5)
    assert rows[(5, "agent", "outbox")][0] == pytest.approx(20, abs=0.5)  # 100 s minus 80 s paused
    assert rows[(5, "delivery", "outbox")][0] == pytest.approx(100, abs=0.5)
    assert charts[("agent", 0)][1] == pytest.approx(20, abs=0.5)


def test_queued_jobs_a_dead_worker_prefetched_explain_the_gap_in_a_banner(redis_conn):
    from rq import Queue
    from rq.serializers import JSONSerializer

    from dispatch_app.rq.fields import TAKEN_BY
    from dispatch_app.views import board

    q = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    waiting, taken = [], []
    for i in range(5):
        j = job("delivery", "queued", dispatched_ago=60 - i)
        rq_job = q.enqueue("dispatch_app.execution.execute", "delivery", j.pk, 1, job_id=rq_job_id(j.pk, 1))
        (taken if i < 2 else waiting).append((j, rq_job))
    for _, rq_job in taken:  # taken off the queue by a worker that then died (its hash is gone)
        redis_conn.lrem(q.key, 0, rq_job.id)
        redis_conn.hset(rq_job.key, TAKEN_BY, "w-dead")
    data = board.build(redis_conn=redis_conn)
    (banner,) = [b for b in data["banners"] if b["key"] == "prefetched-by-dead"]
    assert banner["text"].startswith("delivery: 2 queued job(s) were taken off queue delivery by dead worker w-dead")
    assert "PostgreSQL counts 5 queued and Redis 3" in banner["text"]
