"""The operators' numbers say what they claim (issue 12, "numbers mislead"): backoff is not outbox wait, recovery's
touch does not make a stuck job look young, a retired domain's dead envelopes count, dispatchstats stays readable,
and the listener's tick reaches the metrics."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command
from django.db import connection

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.db.clock import db_now
from dispatch_app.housekeeping.metrics import DatabaseCollector
from dispatch_app.housekeeping.wiring import Ops
from dispatch_app.management.commands.dispatchstats import queue_usage, render
from dispatch_app.models import Job
from dispatch_app.runtime.supervisor import Supervisor
from dispatch_app.store import jobs as job_rows
from dispatch_app.timeline import stage_sql, stages
from dispatch_app.views import stats
from tests.integration.opsdata import attempt_row, envelope, job, percentile_cont, sql

pytestmark = pytest.mark.django_db


def test_retry_backoff_is_its_own_stage_not_outbox_wait():
    # Attempt 2 of each job waited 30 s of retry backoff, then 1-4 s in the outbox, then 0.5 s in RQ.
    outbox_waits = [1.0, 2.0, 3.0, 4.0]
    for wait in outbox_waits:
        j = job("image_series", "running", attempt=2)
        attempt_row(j, 1, created_ago=900, dispatched_ago=899, started_ago=898, finished_ago=100)  # before 5m
        attempt_row(j, 2, created_ago=100 + wait, due_ago=70 + wait, dispatched_ago=70, started_ago=69.5)
    # A scheduled submit (attempt 1, due 60 s after its submit) counts the same way.
    scheduled = job("delivery", "queued")
    attempt_row(scheduled, 1, created_ago=100, due_ago=40, dispatched_ago=38)

    with connection.cursor() as cursor:
        latency = stats.latency_summary(cursor)
        chart = stats.throughput(cursor, 60)
    lat = latency["image_series"]["5m"]
    assert lat["submitted_to_dispatched"]["count"] == 4
    assert lat["submitted_to_dispatched"]["p50"] == pytest.approx(percentile_cont(outbox_waits, 0.5), abs=1e-3)
    assert lat["submitted_to_dispatched"]["p99"] == pytest.approx(percentile_cont(outbox_waits, 0.99), abs=1e-3)
    assert lat["backoff"]["count"] == 4 and lat["backoff"]["p50"] == pytest.approx(30, abs=1e-3)
    assert lat["dispatched_to_started"]["p95"] == pytest.approx(0.5, abs=1e-3)
    assert latency["delivery"]["5m"]["submitted_to_dispatched"]["p50"] == pytest.approx(2.0, abs=1e-3)
    assert latency["delivery"]["5m"]["backoff"]["p50"] == pytest.approx(60, abs=1e-3)
    # The chart's p95 outbox wait excludes the backoff too.
    minute = next(p for p in chart if p["minutes_ago"] == 1)
    assert minute["dispatched"] == 4 and minute["p95"] == pytest.approx(percentile_cont(outbox_waits, 0.95), abs=1e-3)

    # The job list and the timeline use the same definition, in Python, for one attempt.
    j = Job.objects.filter(domain="image_series").first()
    current = stages.current_attempt(stages.annotate_current(Job.objects.filter(pk=j.pk)).get())
    now = db_now()
    assert current.stage("backoff", now).duration.total_seconds() == pytest.approx(30, abs=1e-3)
    assert current.stage("outbox", now).duration.total_seconds() == pytest.approx(1.0, abs=1e-3)
    assert current.stage("rq", now).duration.total_seconds() == pytest.approx(0.5, abs=1e-3)
    assert current.waiting_in(now) == "worker"


def test_the_oldest_candidate_age_survives_recoverys_touch():
    stuck = job("delivery", "running", started_ago=600, updated_ago=600)
    attempt_row(stuck, 1, created_ago=700, dispatched_ago=650, started_ago=600)
    job("delivery", "submitted")  # young: does not hide the old one
    with connection.cursor() as cursor:
        before = stats.job_summary(cursor)["delivery"]["oldest_candidate_age"]
        # Recovery looks, finds the worker alive, leaves it alone: updated_at moves to now.
        job_rows.touch(cursor, stuck.pk, 1)
        after = stats.job_summary(cursor)["delivery"]["oldest_candidate_age"]
    assert before == pytest.approx(600, abs=2) and after == pytest.approx(600, abs=2)


def test_a_domain_no_longer_registered_keeps_its_dead_envelopes_visible():
    envelope(job("retired", "failed"), "dead", last_error="unknown domain")
    envelope(job("retired", "failed"), "dead", last_error="unknown domain")
    envelope(job("delivery", "failed"), "dead", last_error="refused")
    snap = stats.snapshot()
    assert snap["domains"]["retired"]["envelopes"]["dead"] == 2
    assert snap["domains"]["retired"]["registered"] is False
    assert snap["totals"]["envelopes"]["dead"] == 3
    out = io.StringIO()
    call_command("dispatchstats", stdout=out)
    assert re.search(r"^retired \(unregistered\)\s.*\s0/0/2\s", out.getvalue(), re.MULTILINE)
    families = {f.name: f for f in DatabaseCollector()._collect_db()}
    samples = {tuple(s.labels.values()): s.value for s in families["productflow_envelopes"].samples}
    assert samples[("retired", "dead")] == 2 and samples[("delivery", "dead")] == 1


def test_dispatchstats_columns_never_run_together_and_queue_usage_is_a_percentage():
    # Long cells: minutes-long percentiles over many attempts, a long domain name.
    for _ in range(3):
        j = job("partial_edit", "succeeded")
        attempt_row(j, 1, created_ago=290, dispatched_ago=100, started_ago=50, finished_ago=10)
    snap = stats.snapshot()
    snap["notification_queue_usage"] = 0.0000028610229492187
    text = render(snap)
    assert "NOTIFY queue usage 0.000%" in text and queue_usage(0.25) == "25.000%"
    for block in (text.split("\n\n")[1], text.split("\n\n")[2]):
        lines = [line for line in block.splitlines() if not line.startswith(("dispatch latency", "TOTAL"))]
        header = re.split(r"\s{2,}", lines[0].strip())
        for line in lines[1:]:
            # Cells are two or more spaces apart: two run together would make one cell fewer.
            assert len(re.split(r"\s{2,}", line.strip())) == len(header), line
    latency_lines = text.split("\n\n")[2].splitlines()
    row = next(line for line in latency_lines if line.startswith("partial_edit"))
    assert len(re.split(r"\s{2,}", row.strip())) == 7  # domain + outbox/RQ/backoff x 5m/60m


@pytest.mark.django_db(transaction=True)
def test_the_listeners_tick_counts_in_the_metrics():
    conf = dispatch_settings()
    ops = Ops(conf, {"metrics_port": 0})
    supervisor = Supervisor(conf, observer=ops.observer)
    ops.attach(supervisor)
    try:
        supervisor.listener.start()
        assert supervisor.listener.connected.wait(10)  # a safety net; connected is set right after LISTEN
        ops.heartbeat.run_once()
        ops.heartbeat.run_once()
        assert ops.metrics.loop_ticks.labels("listener")._value.get() == 2
        rows = sql("SELECT last_tick_at IS NOT NULL FROM dispatch_app_loopheartbeat WHERE loop = 'listener'")
        assert rows == [(True,)]
    finally:
        supervisor.request_stop()
        supervisor.listener.join(5)
        supervisor.close()


@pytest.mark.django_db(transaction=True)
def test_attempts_waiting_in_rq_count_as_dispatched_though_the_mark_writes_no_history(redis_conn):
    from dispatch_app.dispatch.loop import DispatchLoop
    from dispatch_app.models import JobAttempt
    from dispatch_app.outbox.submit import submit
    from tests.factories import PAYLOADS

    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(3)]
    loop = DispatchLoop(dispatch_settings())
    try:
        assert loop.run_once("notify").dispatched == 3  # no worker runs: all three wait in RQ
    finally:
        loop.close()
    assert not JobAttempt.objects.filter(job__in=jobs).exists()
    with connection.cursor() as cursor:
        latency = stats.latency_summary(cursor)["delivery"]["5m"]
        minutes = stage_sql.per_minute_by_domain(cursor, 60)
        summary = stats.job_summary(cursor)["delivery"]
    assert latency["submitted_to_dispatched"]["count"] == 3 and latency["dispatched_to_started"]["count"] == 0
    assert minutes[("delivery", 0)][0] == 3 and minutes[("delivery", 0)][2] is None
    assert summary["backlog"]["queued"] == 3 and summary["oldest_candidate_age"] is not None
