"""A dead dispatcher's STALE banner goes once live dispatchers run every loop it ran; its UP stops counting.

Rows written as rundispatcher's heartbeat writes them, with ages set on the database clock; the page is read
through the test client (the banner and the processes table), not only board.build()."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dispatch_app.models import DispatcherProcess, LoopHeartbeat
from dispatch_app.views import board
from tests.integration.opsdata import ago, sql

pytestmark = pytest.mark.version_dependent

LIVE = "/admin/dispatch_app/job/dashboard/live/"


def process(name: str, *, started_ago: float, seen_ago: float, loops: dict[str, float]) -> DispatcherProcess:
    """A dispatcher row and its loops (loop -> seconds since its last tick)."""
    row = DispatcherProcess.objects.create(name=name, hostname="h", pid=1)
    sql(
        f"UPDATE dispatch_app_dispatcherprocess SET started_at = {ago(started_ago)}, last_seen_at = {ago(seen_ago)} "
        "WHERE id = %s",
        [row.pk],
    )
    for loop, tick_ago in loops.items():
        hb = LoopHeartbeat.objects.create(process=row, loop=loop)
        sql(f"UPDATE dispatch_app_loopheartbeat SET last_tick_at = {ago(tick_ago)} WHERE id = %s", [hb.pk])
    return row


def stale_banners(data) -> list[str]:
    return [b["text"] for b in data["banners"] if b["key"] == "stale-process"]


@pytest.mark.django_db
def test_a_dead_dispatchers_banner_names_what_nobody_runs_and_goes_once_everything_runs_again(client, redis_conn):
    dead_loops = {"dispatch": 400, "recovery-delivery": 400, "recovery-agent": 400, "heartbeat": 400}
    process("dead:1", started_ago=1000, seen_ago=400, loops=dead_loops)
    data = board.build(redis_conn=redis_conn)
    (text,) = stale_banners(data)
    assert "no-dispatcher" in [b["key"] for b in data["banners"]]
    assert "Dispatcher dead:1 is STALE" in text

    # A new dispatcher with dispatch and delivery's recovery only: agent's recovery still runs nowhere.
    process("new:2", started_ago=30, seen_ago=1, loops={"dispatch": 1, "recovery-delivery": 2, "heartbeat": 1})
    (text,) = stale_banners(board.build(redis_conn=redis_conn))
    assert text.endswith("no live dispatcher runs: recovery-agent.")

    # A second live one runs agent's recovery, but its loop is stale: not covered yet.
    third = process("new:3", started_ago=30, seen_ago=1, loops={"recovery-agent": 900})
    assert len(stale_banners(board.build(redis_conn=redis_conn))) == 1

    sql(f"UPDATE dispatch_app_loopheartbeat SET last_tick_at = {ago(1)} WHERE process_id = %s", [third.pk])
    data = board.build(redis_conn=redis_conn)
    assert stale_banners(data) == []
    (dead,) = [p for p in data["dispatchers"] if p["name"] == "dead:1"]
    assert dead["stale"] and dead["replaced"]
    # Its UP is what it ran (started 1000 s ago, last seen 400 s ago), not 1000 s and counting.
    assert dead["uptime"] == pytest.approx(600, abs=1)

    client.force_login(User.objects.create_superuser("op", password="pw"))
    page = client.get(LIVE).content.decode()
    assert 'data-key="stale-process"' not in page
    assert "STALE (replaced: its loops run live elsewhere)" in page and "(until last seen)" in page


@pytest.mark.django_db
def test_a_dead_dispatcher_that_recorded_no_loop_is_replaced_by_any_live_one(redis_conn):
    process("dead:1", started_ago=500, seen_ago=300, loops={})
    assert len(stale_banners(board.build(redis_conn=redis_conn))) == 1
    process("new:2", started_ago=10, seen_ago=1, loops={})
    assert stale_banners(board.build(redis_conn=redis_conn)) == []


@pytest.mark.django_db
def test_a_live_dispatchers_uptime_counts_on(redis_conn):
    process("new:2", started_ago=100, seen_ago=1, loops={"dispatch": 1})
    (p,) = board.build(redis_conn=redis_conn)["dispatchers"]
    assert not p["stale"] and p["uptime"] == pytest.approx(100, abs=1)
