"""Heartbeats: a process row and each loop's last successful tick, in database time."""

from __future__ import annotations

import os
import threading

import pytest
from django.db import connection

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.db.clock import db_now
from dispatch_app.housekeeping.heartbeat import HeartbeatLoop, HeartbeatTracker
from dispatch_app.models import DispatcherProcess, LoopHeartbeat
from dispatch_app.views import stats
from tests.integration.opsdata import ago, sql

pytestmark = pytest.mark.django_db


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_records_the_process_and_each_loops_last_tick_in_database_time():
    clock = FakeClock()
    tracker = HeartbeatTracker(clock=clock)
    beat = HeartbeatLoop(dispatch_settings(), tracker, threading.Event())
    beat.register()
    tracker.loop_tick("dispatch")
    clock.now += 30  # the dispatch loop ticked 30 s before the heartbeat writes
    tracker.loop_tick("recovery-delivery")
    tracker.loop_error("recovery-delivery", RuntimeError("vendor down"))
    assert beat.run_once() == 2

    rows = {h.loop: h for h in LoopHeartbeat.objects.filter(process_id=beat.process_id)}
    now = db_now()
    assert (now - rows["dispatch"].last_tick_at).total_seconds() == pytest.approx(30, abs=1)
    assert (now - rows["recovery-delivery"].last_tick_at).total_seconds() == pytest.approx(0, abs=1)
    assert rows["recovery-delivery"].errors == 1 and "vendor down" in rows["recovery-delivery"].last_error
    # Nothing changed since: no loop row is rewritten, only last_seen_at.
    assert beat.run_once() == 0

    with connection.cursor() as cursor:
        listed = stats.dispatchers(cursor, stale_seconds=60)
    assert [p["name"] for p in listed] == [beat.process_name]
    loops = {loop["loop"]: loop for loop in listed[0]["loops"]}
    assert loops["dispatch"]["stale"] is False

    sql(f"UPDATE dispatch_app_dispatcherprocess SET last_seen_at = {ago(120)} WHERE id = %s", [beat.process_id])
    with connection.cursor() as cursor:
        assert stats.dispatchers(cursor, stale_seconds=60)[0]["stale"] is True

    beat.mark_stopped()
    assert DispatcherProcess.objects.get(pk=beat.process_id).stopped_at is not None
    with connection.cursor() as cursor:
        assert stats.dispatchers(cursor, stale_seconds=60) == []


def test_a_pruned_process_registers_again():
    tracker = HeartbeatTracker()
    beat = HeartbeatLoop(dispatch_settings(), tracker, threading.Event())
    first = beat.register()
    tracker.loop_tick("dispatch")
    DispatcherProcess.objects.filter(pk=first).delete()
    beat.run_once()
    assert beat.process_id != first
    assert LoopHeartbeat.objects.filter(process_id=beat.process_id, loop="dispatch").exists()


@pytest.mark.django_db(transaction=True)
def test_a_running_supervisor_writes_heartbeats_for_its_loops(redis_conn):
    from dispatch_app.runtime import assembly
    from tests.helpers import wait_until

    conf = dispatch_settings(POLL_INTERVAL=0.05, HEARTBEAT_INTERVAL=0.05)
    supervisor = assembly.build(conf, {"no_listen": True, "no_recovery": True})
    process_id = supervisor.ops.heartbeat.process_id
    supervisor.start()
    try:
        wait_until(
            lambda: (
                {"dispatch", "heartbeat"}
                <= set(LoopHeartbeat.objects.filter(process_id=process_id).values_list("loop", flat=True))
            ),
            timeout=20,
            message="dispatch and heartbeat ticks recorded",
        )
    finally:
        supervisor.request_stop()
        assert supervisor.join(10) == []
        supervisor.close()
    assert DispatcherProcess.objects.get(pk=process_id).stopped_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_database_away_at_start_up_defers_the_registration_to_the_first_beat(redis_conn, caplog):
    """Registering is a new dispatcher's first statement (before its start-up check): PostgreSQL restarting then
    must not end the process. Found by scenario 41 (a crash during a dispatcher's start)."""
    from dispatch_app.runtime import assembly

    settings = connection.settings_dict
    port = settings["PORT"]
    connection.close()
    settings["PORT"] = 1  # nothing listens: refused, as while PostgreSQL restarts
    try:
        supervisor = assembly.build(dispatch_settings(), {"no_listen": True, "no_recovery": True})
    finally:
        settings["PORT"] = port
    try:
        beat = supervisor.ops.heartbeat
        assert beat.process_id is None
        assert [r.action for r in caplog.records if getattr(r, "domain", "") == "ops"] == [
            "heartbeat_register_deferred"
        ]
        assert not DispatcherProcess.objects.exists()
        beat.run_once()
        assert DispatcherProcess.objects.filter(pk=beat.process_id, pid=os.getpid()).exists()
    finally:
        supervisor.close()
