"""A process's PostgreSQL session says whether it lives (dispatch_app.db.liveness): real sessions, real kills.

A killed process's session is gone at once, so recovery (its worker evidence),
the worker health view and the dispatcher list read it dead in seconds, where
the heartbeat keys and rows would say so only at their expiry; a live process
whose session is terminated reconnects and reads alive again.
"""

from __future__ import annotations

import signal
import subprocess
import textwrap

import pytest
from django.db import connection

from dispatch_app.db import liveness
from dispatch_app.recovery.evidence import worker_seen
from dispatch_app.rq.state import health
from dispatch_app.rq.state import queues as rqside
from dispatch_app.views import stats
from tests.helpers import PYTHON, ROOT, wait_until

pytestmark = pytest.mark.django_db(transaction=True)  # sessions of other processes see committed rows only

CHILD = textwrap.dedent(
    """
    import sys, django
    django.setup()
    from dispatch_app.db import liveness
    beacon = liveness.Beacon(sys.argv[1], liveness.django_conninfo)
    beacon.start()
    assert beacon.connected.wait(20)
    print(beacon.claim, flush=True)
    sys.stdin.read()  # until the test kills it
    """
)


@pytest.fixture
def beacon():
    started = []

    def start(tag: str) -> liveness.Beacon:
        b = liveness.Beacon(tag, liveness.django_conninfo, check_every=0.2, retry_every=0.05)
        b.start()
        started.append(b)
        assert b.connected.wait(10)
        return b

    yield start
    for b in started:
        b.stop()


def verdict(name: str, claim: str | None) -> bool | None:
    with connection.cursor() as cursor:
        return liveness.verdicts(cursor, {name: claim})[name]


def sessions(tag: str) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [tag])
        return [row[0] for row in cursor.fetchall()]


def test_a_killed_process_reads_dead_at_once_and_a_live_one_alive(subprocess_env):
    tag = liveness.tag(liveness.WORKER, "kill-me")
    child = subprocess.Popen(
        [PYTHON, "-c", CHILD, tag],
        cwd=ROOT,
        env=subprocess_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        claim = child.stdout.readline().strip()
        assert claim.startswith(f"{tag} "), claim
        assert verdict("kill-me", claim) is True
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        # PostgreSQL ends the backend when the socket closes; the bound is a safety net, not a sleep.
        wait_until(lambda: verdict("kill-me", claim) is False, timeout=5, message="the killed process's session gone")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_a_terminated_session_of_a_live_process_comes_back(beacon):
    b = beacon(liveness.tag(liveness.DISPATCHER, "terminated"))
    (first,) = sessions(b.tag)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [first])
    wait_until(lambda: sessions(b.tag) not in ([], [first]), timeout=10, message="the beacon back on a new session")
    assert verdict("terminated", b.claim) is True


def test_a_session_on_another_server_or_none_at_all_cannot_be_seen():
    assert verdict("w", None) is None  # it named none: judged by its heartbeat
    assert verdict("w", "pf-worker:w otherdb@1.0") is None  # not this server (or it restarted since)
    assert verdict("w", "garbage") is None


def test_a_long_name_fits_in_an_application_name():
    tag = liveness.tag(liveness.WORKER, "x" * 200)
    assert len(tag.encode()) <= liveness.NAME_BYTES
    assert tag == liveness.tag(liveness.WORKER, "x" * 200) != liveness.tag(liveness.WORKER, "x" * 199)


def _fake_worker_hash(redis_conn, name: str, claim: str | None) -> None:
    """A worker hash as a PipelineWorker leaves it (killed workers leave theirs until it expires)."""
    from rq.utils import now, utcformat
    from rq.worker import Worker
    from rq.worker_registration import REDIS_WORKER_KEYS

    key = Worker.redis_worker_namespace_prefix + name
    fields = {"birth": utcformat(now()), "last_heartbeat": utcformat(now()), "queues": "workflow", "state": "busy"}
    if claim:
        fields[liveness.WORKER_HASH_FIELD] = claim
    redis_conn.hset(key, mapping=fields)
    redis_conn.expire(key, 60)
    redis_conn.sadd(REDIS_WORKER_KEYS, key)


def test_recovery_and_the_health_view_tell_a_dead_worker_from_a_live_one(redis_conn, beacon):
    live = beacon(liveness.tag(liveness.WORKER, "w-live"))
    dead = beacon(liveness.tag(liveness.WORKER, "w-dead"))
    _fake_worker_hash(redis_conn, "w-live", live.claim)
    _fake_worker_hash(redis_conn, "w-dead", dead.claim)
    _fake_worker_hash(redis_conn, "w-old", None)  # names no session: its live hash says alive
    dead.stop()
    wait_until(lambda: not sessions(dead.tag), timeout=5, message="the stopped beacon's session gone")

    assert worker_seen("w-live", redis_conn)[0] is True
    assert worker_seen("w-dead", redis_conn)[0] is False  # its hash still lives: the session says dead
    assert worker_seen("w-old", redis_conn)[0] is True
    seen = {w.name: (w.session_alive, w.alive) for w in health.workers(redis_conn)}
    assert seen == {"w-live": (True, True), "w-dead": (False, False), "w-old": (None, True)}
    assert any("DEAD" in line for line in health.render(health.snapshot(redis_conn)) if "w-dead" in line)
    judged = rqside.read_workers(redis_conn, ["w-live", "w-dead", "w-old"])
    assert {name: (w.alive, w.dead_reason) for name, w in judged.items()} == {
        "w-live": (True, ""),
        "w-dead": (False, "its PostgreSQL session is gone"),
        "w-old": (True, ""),
    }


def test_a_dispatcher_without_its_session_is_stale_at_once(beacon):
    live = beacon(liveness.tag(liveness.DISPATCHER, "d-live"))
    dead = beacon(liveness.tag(liveness.DISPATCHER, "d-dead"))
    with connection.cursor() as cursor:
        for name, tag in (("d-live", live.tag), ("d-dead", dead.tag), ("d-old", "")):
            cursor.execute(
                "INSERT INTO dispatch_app_dispatcherprocess (name, hostname, pid, session) VALUES (%s, 'h', 1, %s)",
                [name, tag],
            )
    dead.stop()
    wait_until(lambda: not sessions(dead.tag), timeout=5, message="the stopped beacon's session gone")
    with connection.cursor() as cursor:
        rows = {p["name"]: (p["session_alive"], p["stale"]) for p in stats.dispatchers(cursor, stale_seconds=120)}
    assert rows == {"d-live": (True, False), "d-dead": (False, True), "d-old": (None, False)}
