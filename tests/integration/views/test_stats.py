"""``dispatchstats --json`` against a constructed scenario whose truth is known (ages from the database clock)."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from dispatch_app.models import DispatcherProcess, LoopHeartbeat, RecoveryRound
from tests.integration.opsdata import ago, envelope, job, percentile_cont, sql

pytestmark = pytest.mark.django_db

AGE = pytest.approx  # ages grow while the test runs: compare within a couple of seconds


def age(expected: float):
    return AGE(expected, abs=2.0)


def exact(value: float):
    return pytest.approx(value, abs=1e-3)


def run_json() -> dict:
    out = io.StringIO()
    call_command("dispatchstats", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_dispatchstats_json_equals_the_constructed_truth():
    # --- backlog and the oldest recovery candidate (time in the current stage, not updated_at) ----
    waiting = job("delivery", "submitted", updated_ago=100)
    envelope(waiting, "pending", created_ago=100)
    job("delivery", "queued", updated_ago=400, submitted_ago=450, dispatched_ago=420)
    job("delivery", "running", updated_ago=50)
    job("delivery", "succeeded", updated_ago=9999)  # finished: not a candidate, not backlog
    # A backoff (tried once, due later) counts as waiting; a never-tried one scheduled for later does not.
    retrying = job("workflow", "submitted", updated_ago=30, submitted_ago=250)
    envelope(retrying, "pending", created_ago=250, available_ago=-60, send_attempts=1, last_error="boom")
    scheduled = job("workflow", "submitted", updated_ago=10)
    envelope(scheduled, "pending", created_ago=900, available_ago=-600)
    dead_job = job("agent", "failed", updated_ago=5)
    envelope(dead_job, "dead", created_ago=70, send_attempts=8, last_error="refused")

    # --- dispatch latencies: known outbox waits, dispatched at known times ----
    recent = [0.2, 0.5, 1.0, 1.5, 3.0, 8.0]  # dispatched 60 s ago: in both windows
    older = [20.0, 40.0]  # dispatched 30 min ago: only in the 60-minute window
    queue_waits = {0.2: 0.1, 0.5: 0.3, 1.0: 2.0}  # started this long after dispatch
    for wait in recent:
        j = job("image_series", "queued")
        envelope(j, "dispatched", created_ago=60 + wait, dispatched_ago=60)
        if wait in queue_waits:
            sql(
                "UPDATE dispatch_app_job j SET started_at = e.dispatched_at + make_interval(secs => %s), "
                "status = 'running' FROM dispatch_app_dispatchenvelope e WHERE e.job_id = j.id AND j.id = %s",
                [queue_waits[wait], j.pk],
            )
    for wait in older:
        j = job("image_series", "succeeded")
        envelope(j, "dispatched", created_ago=1800 + wait, dispatched_ago=1800)
    # Outside both windows: must not count.
    envelope(job("image_series", "succeeded"), "dispatched", created_ago=7300, dispatched_ago=7200)

    # --- recovery rounds --------------------------------------------------------
    def round_(domain, started_ago, **counts):
        r = RecoveryRound.objects.create(domain=domain, **counts)
        sql(
            f"UPDATE dispatch_app_recoveryround SET started_at = {ago(started_ago)}, "
            f"finished_at = {ago(started_ago - 2)} WHERE id = %s",
            [r.pk],
        )
        return r

    round_("delivery", 7200, scanned=100, redispatched=100)  # older than the rate's hour
    round_("delivery", 600, scanned=10, redispatched=2, unknown=1, left_alone=7, has_more=True)
    round_("delivery", 60, scanned=10, redispatched=1, left_alone=9)

    # --- dispatcher processes ---------------------------------------------------
    fresh = DispatcherProcess.objects.create(name="a:1", hostname="a", pid=1)
    silent = DispatcherProcess.objects.create(name="b:2", hostname="b", pid=2)
    DispatcherProcess.objects.create(name="c:3", hostname="c", pid=3)
    sql(f"UPDATE dispatch_app_dispatcherprocess SET last_seen_at = {ago(500)} WHERE id = %s", [silent.pk])
    sql("UPDATE dispatch_app_dispatcherprocess SET stopped_at = clock_timestamp() WHERE name = 'c:3'")
    LoopHeartbeat.objects.create(process=fresh, loop="dispatch")
    LoopHeartbeat.objects.create(process=fresh, loop="recovery-delivery")
    sql(f"UPDATE dispatch_app_loopheartbeat SET last_tick_at = {ago(3)} WHERE loop = 'dispatch'")
    sql(f"UPDATE dispatch_app_loopheartbeat SET last_tick_at = {ago(300)} WHERE loop = 'recovery-delivery'")

    snap = run_json()
    domains = snap["domains"]

    delivery = domains["delivery"]
    assert delivery["backlog"] == {"submitted": 1, "queued": 1, "running": 1}
    assert delivery["oldest_candidate_age"] == age(420)  # the queued job, dispatched 420 s ago
    assert delivery["envelopes"]["pending"] == 1 and delivery["envelopes"]["due"] == 1
    assert delivery["envelopes"]["oldest_pending_age"] == age(100)

    workflow = domains["workflow"]
    assert workflow["envelopes"] == {"pending": 2, "due": 0, "dead": 0, "oldest_pending_age": age(250)}
    assert workflow["oldest_candidate_age"] == age(250)  # in the outbox since its submit, touched or not
    assert domains["agent"]["envelopes"]["dead"] == 1
    assert domains["agent"]["backlog"] == {"submitted": 0, "queued": 0, "running": 0}
    assert domains["agent"]["oldest_candidate_age"] is None
    assert snap["totals"]["oldest_pending_age"] == age(250)
    assert snap["totals"]["envelopes"] == {"pending": 3, "due": 1, "dead": 1}

    rounds = delivery["recovery"]["rounds"]
    assert [r["scanned"] for r in rounds] == [10, 10, 100]  # newest first
    assert [r["effective"] for r in rounds] == [1, 3, 100]
    assert rounds[1]["has_more"] is True and rounds[0]["age"] == age(60)
    assert delivery["recovery"]["effective_rate"] == exact(4 / 20)
    assert domains["workflow"]["recovery"]["effective_rate"] is None

    lat = domains["image_series"]["latency"]
    for window, values in (("5m", recent), ("60m", recent + older)):
        outbox = lat[window]["submitted_to_dispatched"]
        assert outbox["count"] == len(values)
        for key, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            assert outbox[key] == exact(percentile_cont(values, q)), (window, key)
        queue = lat[window]["dispatched_to_started"]
        assert queue["count"] == 3
        assert queue["p50"] == exact(percentile_cont(list(queue_waits.values()), 0.5))
        assert queue["p99"] == exact(percentile_cont(list(queue_waits.values()), 0.99))
    assert snap["totals"]["latency"]["60m"]["submitted_to_dispatched"]["count"] == len(recent + older)
    assert domains["delivery"]["latency"]["5m"]["submitted_to_dispatched"] == {
        "count": 0,
        "p50": None,
        "p95": None,
        "p99": None,
    }

    chart = snap["throughput"]
    assert len(chart) == 60 and sum(p["dispatched"] for p in chart) == len(recent + older)
    assert next(p for p in chart if p["minutes_ago"] == 1)["dispatched"] == len(recent)

    processes = {p["name"]: p for p in snap["dispatchers"]}
    assert set(processes) == {"a:1", "b:2"}  # a stopped process is not listed
    assert processes["a:1"]["stale"] is False and processes["b:2"]["stale"] is True
    assert processes["b:2"]["last_seen_age"] == age(500)
    loops = {loop["loop"]: loop for loop in processes["a:1"]["loops"]}
    assert loops["dispatch"]["stale"] is False and loops["dispatch"]["last_tick_age"] == age(3)
    assert loops["recovery-delivery"]["stale"] is True


def test_dispatchstats_table_is_readable():
    envelope(job("delivery", "submitted"), "pending", created_ago=42)
    out = io.StringIO()
    call_command("dispatchstats", stdout=out)
    text = out.getvalue()
    assert "delivery" in text and "TOTAL" in text and "dispatch latency" in text
    assert "no" in text or "none running" in text
