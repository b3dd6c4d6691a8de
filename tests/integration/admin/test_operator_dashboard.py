"""The operator's dashboard: the RQ side, banners, failures, pause/resume and retries, against real
PostgreSQL and Redis (RQ's own Worker/Queue classes write what a real worker would)."""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from dispatch_app.actions import operator as actions
from dispatch_app.models import DispatchEnvelope, DomainPause, Job, JobEvent
from dispatch_app.outbox.submit import submit
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.state import jobs as rqjobs
from dispatch_app.store.claim import claim_batch
from dispatch_app.views import board
from tests.factories import PAYLOADS
from tests.integration.opsdata import envelope, job, sql

pytestmark = pytest.mark.version_dependent

JOBS = "/admin/dispatch_app/job/"
DASHBOARD = "/admin/dispatch_app/job/dashboard/"
LIVE = DASHBOARD + "live/"
VIEW = ("dispatch_app.view_job", "dispatch_app.view_dispatchenvelope", "dispatch_app.view_dispatch_dashboard")


def staff(username="operator", *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return User.objects.get(pk=user.pk)


def enqueue(redis_conn, queue: str, job_id: int, attempt: int = 1):
    q = Queue(queue, connection=redis_conn, serializer=JSONSerializer)
    return q.enqueue("dispatch_app.execution.execute", queue, job_id, attempt, job_id=rq_job_id(job_id, attempt))


def worker(redis_conn, *queues: str, name: str) -> SimpleWorker:
    w = SimpleWorker(
        [Queue(q, connection=redis_conn, serializer=JSONSerializer) for q in queues],
        connection=redis_conn,
        name=name,
        serializer=JSONSerializer,
    )
    w.register_birth()
    return w


def banner_keys(data) -> list[str]:
    return [b["key"] for b in data["banners"]]


@pytest.mark.django_db
def test_queued_jobs_with_no_worker_are_red_with_depth_and_the_oldest_wait(redis_conn):
    waiting = []
    for i in range(3):
        j = job("delivery", "queued", dispatched_ago=1800 - i)
        envelope(j, "dispatched", created_ago=1801, dispatched_ago=1800 - i)
        enqueue(redis_conn, "delivery", j.pk)
        waiting.append(j)
    data = board.build(redis_conn=redis_conn)
    rq = data["domains"]["delivery"]["rq"]
    assert (rq["depth"], rq["live_workers"], rq["workers"]) == (3, 0, 0)
    assert rq["oldest_wait"] == pytest.approx(1800, abs=5)  # the head job, aged on the database clock
    no_worker = [b for b in data["banners"] if b["key"] == "no-worker"]
    assert len(no_worker) == 1 and "delivery: 3 job(s) waiting in RQ queue delivery" in no_worker[0]["text"]
    assert "no-dispatcher" in banner_keys(data)

    state = rqjobs.job_state(waiting[1].pk, 1, "delivery", redis_conn)
    assert (state.position, state.depth, state.live_workers) == (2, 3, 0)

    # A worker comes: the banner goes, the count shows it.
    w = worker(redis_conn, "delivery", "agent", name="w-delivery")
    data = board.build(redis_conn=redis_conn)
    assert data["domains"]["delivery"]["rq"]["live_workers"] == 1
    assert "no-worker" not in banner_keys(data)
    assert rqjobs.job_state(waiting[1].pk, 1, "delivery", redis_conn).live_workers == 1
    w.register_death()


@pytest.mark.django_db
def test_a_running_job_whose_worker_is_gone_says_so(redis_conn):
    j = job("image_series", "running", dispatched_ago=100, started_ago=90)
    rq_job = enqueue(redis_conn, "image_series", j.pk)
    w = worker(redis_conn, "image_series", name="w-gone")
    w.prepare_job_execution(rq_job)  # what RQ does when the worker takes the job: job hash names the worker
    state = rqjobs.job_state(j.pk, 1, "image_series", redis_conn)
    assert (state.worker, state.worker_alive) == ("w-gone", True)
    # Killed without a goodbye: its hash is gone when the TTL runs out (done here at once).
    redis_conn.delete(w.key)
    state = rqjobs.job_state(j.pk, 1, "image_series", redis_conn)
    assert state.worker_alive is False and "hash is gone" in state.worker_dead_reason
    assert state.last_heartbeat is not None


@pytest.mark.django_db
def test_a_local_worker_whose_pid_is_gone_is_dead_at_once(redis_conn):
    import subprocess

    w = worker(redis_conn, "workflow", name="w-pid")
    child = subprocess.Popen(["true"])
    child.wait()
    redis_conn.hset(w.key, "pid", child.pid)  # a pid that existed on this host and is gone
    data = board.build(redis_conn=redis_conn)
    (info,) = [x for x in data["rq"]["workers"] if x["name"] == "w-pid"]
    assert info["alive"] is False and f"pid {child.pid} no longer exists" in info["dead_reason"]
    assert data["domains"]["workflow"]["rq"]["live_workers"] == 0


@pytest.mark.django_db
def test_a_worker_failing_every_job_dead_envelopes_and_a_stale_loop_are_banners(redis_conn):
    from dispatch_app.models import DispatcherProcess, LoopHeartbeat
    from tests.integration.opsdata import ago

    w = worker(redis_conn, "agent", name="w-broken")
    for _ in range(5):
        w.increment_failed_job_count()
    # The project's PipelineWorker also keeps its recent outcomes: succeeded twice, then cannot deserialize.
    p = worker(redis_conn, "workflow", name="w-pickle")
    redis_conn.hset(p.key, mapping={"pf_recent": "ssd", "pf_last_error": "DeserializationError: invalid load key"})
    redis_conn.hset(p.key, mapping={"successful_job_count": 2, "failed_job_count": 1})
    envelope(job("agent", "failed"), "dead", last_error="refused")
    envelope(job("retired", "failed"), "dead", last_error="unknown domain")
    process = DispatcherProcess.objects.create(name="h:1:x", hostname="h", pid=1)
    hb = LoopHeartbeat.objects.create(process=process, loop="recovery-agent")
    sql(f"UPDATE dispatch_app_loopheartbeat SET last_tick_at = {ago(900)} WHERE id = %s", [hb.pk])
    # The dispatch loop's Redis breaker holds dispatch (it still ticks); the recovery child died after its last tick.
    paused = "dispatch paused: Redis refuses writes (OOM: used memory > maxmemory): OutOfMemoryError"
    LoopHeartbeat.objects.create(process=process, loop="dispatch", last_error=paused)
    child = LoopHeartbeat.objects.create(process=process, loop="recovery-process", last_error="ChildExited: died")
    sql(
        f"UPDATE dispatch_app_loopheartbeat SET last_tick_at = {ago(1)}, last_error_at = {ago(5)} "
        "WHERE loop = 'dispatch'"
    )
    sql(
        f"UPDATE dispatch_app_loopheartbeat SET last_tick_at = {ago(30)}, last_error_at = {ago(2)} WHERE id = %s",
        [child.pk],
    )
    gone = DispatcherProcess.objects.create(name="h:2:y", hostname="h", pid=2)
    # It ran workflow's recovery, which no live process runs now (h:1:x runs agent's): its banner stays.
    LoopHeartbeat.objects.create(process=gone, loop="recovery-workflow")
    sql(f"UPDATE dispatch_app_dispatcherprocess SET last_seen_at = {ago(3600)} WHERE id = %s", [gone.pk])
    data = board.build(redis_conn=redis_conn)
    assert [b["level"] for b in data["banners"] if b["key"] == "stale-process"] == ["warning"]
    texts = {b["key"]: [] for b in data["banners"]}
    for b in data["banners"]:
        texts[b["key"]].append(b["text"])
    assert any("w-broken" in t and "fails every job" in t for t in texts["failing-worker"])
    assert any(
        "w-pickle" in t and t.endswith(": DeserializationError: invalid load key.") for t in texts["failing-worker"]
    )
    assert any(t.startswith("agent: 1 dead envelope") for t in texts["dead-envelopes"])
    assert any(t.startswith("retired (not a registered domain): 1 dead") for t in texts["dead-envelopes"]), texts
    assert any("recovery-agent" in t for t in texts["stale-loop"])
    assert texts["dispatch-paused"] == [f"h:1:x: {paused}."]
    assert texts["recovery-process"] == ["Recovery child process of h:1:x: ChildExited: died."]
    assert "no-dispatcher" not in texts
    w.register_death()
    p.register_death()


@pytest.mark.django_db
def test_failure_counts_and_rates_per_domain_and_window(redis_conn):
    for status, finished_ago in (("failed", 60), ("outcome_unknown", 120), ("succeeded", 30), ("failed", 1800)):
        j = job("image_series", "running", started_ago=finished_ago + 5)
        sql(
            "UPDATE dispatch_app_job SET status = %s, finished_at = clock_timestamp() - make_interval(secs => %s) "
            "WHERE id = %s",
            [status, finished_ago, j.pk],
        )
    data = board.build(redis_conn=redis_conn)
    f = data["domains"]["image_series"]["failures"]
    assert f["5m"] == {"ended": 3, "failed": 1, "outcome_unknown": 1, "rate": pytest.approx(2 / 3, abs=1e-3)}
    assert f["60m"]["failed"] == 2 and f["60m"]["ended"] == 4
    assert data["domains"]["delivery"]["failures"]["5m"]["rate"] is None


@pytest.mark.django_db
def test_dashboard_page_fragment_and_json_render_and_link_counts(client, redis_conn):
    j = job("delivery", "queued")
    enqueue(redis_conn, "delivery", j.pk)
    client.force_login(staff("viewer", *VIEW))
    page = client.get(DASHBOARD).content.decode()
    assert 'id="pf-live"' in page and "setInterval" in page
    # No CDN, no framework: the only script files are Django admin's own.
    assert all(src.startswith("/static/admin/") for src in re.findall(r'<script src="([^"]+)"', page))
    assert 'data-key="no-worker"' in page and 'data-key="no-dispatcher"' in page
    assert f"{JOBS}?domain__exact=delivery&amp;status__exact=queued" in page
    live = client.get(LIVE)
    assert live.status_code == 200 and "no-store" in live["Cache-Control"]
    assert "<html" not in live.content.decode() and 'id="pf-rq"' in live.content.decode()
    data = client.get(DASHBOARD + "data.json").json()
    assert data["domains"]["delivery"]["rq"]["depth"] == 1
    # the admin index links to the dashboard
    assert DASHBOARD in client.get("/admin/").content.decode()


@pytest.mark.django_db
def test_a_403_names_the_missing_permission(client):
    client.force_login(staff("viewer", "dispatch_app.view_job"))
    response = client.get(DASHBOARD)
    assert response.status_code == 403
    assert "dispatch_app.view_dispatch_dashboard" in response.content.decode()
    response = client.post(DASHBOARD + "pause/", {"domain": "delivery", "op": "pause"})
    assert response.status_code == 403 and "dispatch_app.pause_domain" in response.content.decode()
    client.force_login(staff("dashboard-only", "dispatch_app.view_dispatch_dashboard"))
    response = client.get(JOBS)
    text = html.unescape(response.content.decode())
    assert response.status_code == 403 and "'dispatch_app.view_job', which dashboard-only lacks" in text


@pytest.mark.django_db(transaction=True)
def test_pause_keeps_envelopes_pending_and_resume_dispatches_them(client, redis_conn):
    paused_job = submit("image_series", PAYLOADS["image_series"])
    other = submit("delivery", PAYLOADS["delivery"])
    client.force_login(staff("pauser", *VIEW, "dispatch_app.pause_domain"))
    client.post(
        DASHBOARD + "pause/", {"domain": "image_series", "op": "pause", "reason": "vendor incident", "confirmed": "yes"}
    )
    assert DomainPause.objects.get().paused_by == "pauser"
    claim = claim_batch(10, 30)
    assert [c.job_id for c in claim.envelopes] == [other.pk]  # the paused domain's envelope is passed over
    assert DispatchEnvelope.objects.get(job=paused_job).lease_token is None
    page = client.get(LIVE).content.decode()
    assert "PAUSED" in page and "vendor incident" in page and 'data-key="paused"' in page

    client.post(DASHBOARD + "pause/", {"domain": "image_series", "op": "resume", "reason": "fixed", "confirmed": "yes"})
    assert not DomainPause.objects.exists()
    assert [c.job_id for c in claim_batch(10, 30).envelopes] == [paused_job.pk]
    log = list(LogEntry.objects.order_by("id").values_list("change_message", flat=True))
    assert log == ["Paused dispatch: vendor incident", "Resumed dispatch: fixed"]
    with pytest.raises(ValueError, match="unknown domain 'nope'"):
        actions.pause_domain("nope")


@pytest.mark.django_db
def test_retry_of_failed_and_unknown_jobs_asks_first_and_warns_for_pending_vendor_requests(client):
    safe = job("delivery", "failed", finished_ago=60)
    risky = job("image_series", "outcome_unknown", finished_ago=60)
    sql("UPDATE dispatch_app_job SET vendor_request_id = 'req-77' WHERE id = %s", [risky.pk])
    from dispatch_app.models import VendorCall

    call = VendorCall.objects.create(
        job=risky, attempt=1, seq=0, purpose="image 1", request_id="req-77", status="unknown"
    )
    done = job("delivery", "succeeded", finished_ago=60)
    client.force_login(staff("retrier", *VIEW, "dispatch_app.retry_job"))
    ids = [safe.pk, risky.pk, done.pk]
    page = client.post(JOBS, {"action": "retry_now", "_selected_action": ids}).content.decode()
    assert "Retry these jobs?" in page and 'id="pf-confirm-retry"' in page
    assert "image_series is not retry-safe" in page and "req-77" in page
    assert f"{done.pk} (succeeded)" in page
    assert Job.objects.get(pk=safe.pk).attempt == 1  # nothing done before the confirmation

    client.post(JOBS, {"action": "retry_now", "_selected_action": ids, "confirmed": "yes"}, follow=True)
    for j in (safe, risky):
        j.refresh_from_db()
        assert (j.attempt, j.status, j.finished_at) == (2, "submitted", None)
        assert DispatchEnvelope.objects.get(job=j, attempt=2).status == "pending"
        assert JobEvent.objects.filter(job=j, kind="operator_redispatch").exists()
    assert Job.objects.get(pk=done.pk).attempt == 1
    call.refresh_from_db()  # confirmed with the call in doubt named: the retry makes it again
    assert call.status == "failed" and call.error.startswith("abandoned: operator retry by retrier")
    entries = LogEntry.objects.filter(user__username="retrier").order_by("object_id")
    assert sorted(int(e.object_id) for e in entries) == [safe.pk, risky.pk]
    assert all("Retried through the outbox: attempt 2" in e.change_message for e in entries)


@pytest.mark.django_db
def test_confirming_a_retry_retries_the_jobs_the_page_listed_though_they_left_the_lists_filter(client):
    """The failures count's link filters on finished_within=5m and the confirming POST goes to that URL: jobs
    whose end left the window while the operator read the confirmation page are still the ones confirmed."""
    ids = [job("delivery", "failed", finished_ago=60).pk for _ in range(3)]
    client.force_login(staff("retrier", *VIEW, "dispatch_app.retry_job"))
    listing = JOBS + "?domain__exact=delivery&status__exact=failed&finished_within=5m"
    page = client.post(listing, {"action": "retry_now", "_selected_action": ids}).content.decode()
    assert 'value="Yes, retry 3 jobs"' in page
    sql("UPDATE dispatch_app_job SET finished_at = finished_at - interval '5 minutes' WHERE id = ANY(%s)", [ids])
    response = client.post(listing, {"action": "retry_now", "_selected_action": ids, "confirmed": "yes"}, follow=True)
    assert sorted(Job.objects.filter(pk__in=ids).values_list("attempt", "status")) == [(2, "submitted")] * 3
    assert sum("re-dispatched as attempt 2" in str(m) for m in response.context["messages"]) == 1


@pytest.mark.django_db
def test_cancel_and_rearm_write_the_admin_log(client):
    j = job("delivery", "submitted")
    envelope(j, "pending")
    dead_job = job("delivery", "failed")
    dead = envelope(dead_job, "dead", last_error="refused")
    client.force_login(staff("op", *VIEW, "dispatch_app.cancel_job", "dispatch_app.rearm_envelope"))
    confirm = {"action": "cancel", "_selected_action": [j.pk], "confirmed": "yes", "reason": "duplicate order"}
    client.post(JOBS, confirm, follow=True)
    client.post("/admin/dispatch_app/dispatchenvelope/", {"action": "rearm", "_selected_action": [dead.pk]})
    messages = set(LogEntry.objects.values_list("change_message", flat=True))
    assert messages == {"Cancelled (was submitted): duplicate order", "Re-armed (back to pending)"}
    assert "Recent actions" in client.get("/admin/").content.decode()


@pytest.mark.django_db
def test_the_timeline_shows_a_queued_jobs_place_and_a_running_jobs_dead_worker(client, redis_conn):
    queued = []
    for _ in range(3):
        j = job("delivery", "queued", dispatched_ago=60)
        enqueue(redis_conn, "delivery", j.pk)
        queued.append(j)
    running = job("agent", "running", dispatched_ago=120, started_ago=100)
    rq_job = enqueue(redis_conn, "agent", running.pk)
    redis_conn.lrem("rq:queue:agent", 0, rq_job.id)
    w = worker(redis_conn, "agent", name="w-killed")
    w.prepare_job_execution(rq_job)
    client.force_login(staff("viewer", *VIEW))

    page = client.get(f"{JOBS}{queued[2].pk}/timeline/").content.decode()
    assert 'id="pf-rq-position">3</strong> of 3' in page and "0 live workers serve it" in page
    page = client.get(f"{JOBS}{running.pk}/timeline/").content.decode()
    assert "Running on worker <strong>w-killed</strong>" in page
    redis_conn.delete(w.key)  # killed: its hash outlives it only until its TTL
    page = client.get(f"{JOBS}{running.pk}/timeline/").content.decode()
    assert "Its worker w-killed is DEAD" in page and "not alive since" in page


@pytest.mark.django_db
def test_dispatchstats_prints_the_alarms_the_rq_side_and_failures(redis_conn):
    import io
    import json

    from django.core.management import call_command

    j = job("delivery", "queued", dispatched_ago=30)
    envelope(j, "dispatched", created_ago=31, dispatched_ago=30)
    enqueue(redis_conn, "delivery", j.pk)
    actions.pause_domain("agent", reason="vendor incident")
    out = io.StringIO()
    call_command("dispatchstats", stdout=out)
    text = out.getvalue()
    assert "ERROR: delivery: 1 job(s) waiting in RQ queue delivery" in text
    assert "WARNING: agent: dispatch paused" in text
    row = next(line for line in text.splitlines() if line.startswith("delivery ") and "running" in line)
    assert row.split()[1:5] == ["delivery", "1+0", "0", "(!)"]  # new + recovery lane
    assert "PAUSED" in next(line for line in text.splitlines() if line.startswith("agent ") and "PAUSED" in line)
    out = io.StringIO()
    call_command("dispatchstats", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["domains"]["delivery"]["rq"]["depth"] == 1 and data["paused"]["agent"]["reason"] == "vendor incident"


@pytest.mark.django_db
def test_an_unreachable_redis_is_a_banner_not_an_error_page():
    import redis

    nobody = redis.Redis(unix_socket_path="/nonexistent-dir/redis.sock", socket_connect_timeout=1)
    data = board.build(redis_conn=nobody)
    (banner,) = [b for b in data["banners"] if b["key"] == "redis"]
    assert banner["level"] == "error" and "Redis cannot be read: ConnectionError" in banner["text"]
    assert data["domains"]["delivery"]["rq"] == {}  # unknown, not "0 workers"
    assert "no-worker" not in banner_keys(data)
