"""Scenario 5: our backends are terminated (``pg_terminate_backend``) under the running daemon.

Private PostgreSQL. The dispatcher's sessions are told apart by PGAPPNAME
(libpq's application_name), so only its own backends are terminated.

- The listener's connection is terminated and new connections are refused for
  a while (``ALLOW_CONNECTIONS false``), so jobs submitted in that gap raise no
  notification anyone hears. When connections are allowed again the listener
  reconnects and its catch-up scan dispatches them long before the fallback
  tick (30 s here).
- Then every backend of a second dispatcher (listener, dispatch loop, heartbeat
  and the other loops) is terminated again and again while jobs arrive: the
  loops reconnect, the daemon keeps running, and everything is dispatched.
"""

import time
from urllib.parse import urlparse

import psycopg
import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.slow, pytest.mark.timeout(180)]

APP = "pf-dispatcher-under-test"
TICK = 30.0

TERMINATE_OURS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE application_name = %s AND datname = current_database() AND pid <> pg_backend_pid()"
)


def listener_backends(stack) -> int:
    return stack.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN%%'", [APP]
    )


def our_backends(stack) -> int:
    return stack.scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP])


def test_listener_catch_up_after_a_gap_and_loops_survive_terminated_backends(private_stack, private_postgres):
    stack = private_stack
    dbname = urlparse(stack.db_url).path.lstrip("/")
    worker = stack.worker("delivery")
    dispatcher = stack.dispatcher(
        "--poll-interval",
        str(TICK),
        "--lease",
        "2",
        PGAPPNAME=APP,
        DISPATCH_LISTEN_TIMEOUT=120,  # no idle ping: the listener's last query stays LISTEN
        DISPATCH_RECONNECT_BACKOFF_MAX=1,
        **short_redis_timeouts(stack.redis_url, 0.5),  # a 2 s lease must outlast a send
    )
    wait_until(lambda: listener_backends(stack) == 1, timeout=30, message="the listener's LISTEN session")
    stack.submit(10, prefix="warm")  # also opens the submitter's connection, kept through the gap
    # Executed, not only dispatched: the worker too must not need a new connection during the gap.
    stack.wait_all("succeeded", 10, timeout=30)

    # --- the gap: listener gone, no new connections -------------------------
    # Both connections are opened before the gap: no new one is allowed during it.
    with psycopg.connect(private_postgres.url(), autocommit=True) as admin, stack.connect() as inside:
        admin.execute(f"ALTER DATABASE {dbname} WITH ALLOW_CONNECTIONS false")
        try:
            killed = inside.execute(TERMINATE_OURS + " AND query LIKE 'LISTEN%%'", [APP]).fetchone()[0]
            assert killed == 1
            wait_until(
                lambda: dispatcher.output().count("listener connection lost") >= 2,
                timeout=20,
                message="the listener to fail reconnecting",
            )
            gap_ids = stack.submit(50, prefix="gap")
            pending = inside.execute(
                "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND status = 'pending'",
                [gap_ids],
            ).fetchone()[0]
            assert pending == 50, "dispatched during the gap: the test would not show the catch-up scan"
        finally:
            admin.execute(f"ALTER DATABASE {dbname} WITH ALLOW_CONNECTIONS true")
    reopened = time.monotonic()
    stack.wait_all("dispatched", 60, timeout=TICK / 2, what="envelopes")
    catch_up_seconds = time.monotonic() - reopened
    assert catch_up_seconds < TICK / 3, f"catch-up took {catch_up_seconds:.1f}s: that was the tick, not the scan"
    assert dispatcher.alive()
    assert dispatcher.stop() == 0, dispatcher.output()

    # --- every backend of the daemon, again and again -----------------------
    dispatcher = stack.dispatcher(
        "--poll-interval",
        "1",
        "--lease",
        "2",
        "--batch-size",
        "20",
        PGAPPNAME=APP,
        DISPATCH_RECONNECT_BACKOFF_MAX=1,
        **short_redis_timeouts(stack.redis_url, 0.5),
    )
    wait_until(lambda: listener_backends(stack) == 1, timeout=30, message="the second dispatcher's listener")
    terminated = 0
    rounds = 12
    for round_no in range(rounds):
        stack.submit(100, prefix=f"storm{round_no}")
        # The listener and at least one loop have (re)connected: terminate them all.
        wait_until(lambda: our_backends(stack) >= 2, timeout=20, message="the daemon's sessions to come back")
        terminated += stack.scalar(TERMINATE_OURS, [APP])
    storm_over = time.monotonic()
    total = 60 + rounds * 100
    stack.wait_all("dispatched", total, timeout=60, what="envelopes")
    settle_seconds = time.monotonic() - storm_over
    stack.wait_all("succeeded", total, timeout=90)
    assert dispatcher.alive(), "the daemon keeps running"
    assert dispatcher.stop() == 0, dispatcher.output()
    output = dispatcher.output()
    worker.stop()

    assert terminated >= 2 * rounds, f"only {terminated} backends terminated: the fault did not happen"
    assert "listener connection lost" in output
    assert "Traceback" not in output.split("stopping (deadline")[-1], "the stop after the storm was not clean"
    report = invariants.check_stack(stack, expected_jobs=total)
    record_figures(
        "05_connections_terminated",
        **report.figures(),
        gap_jobs=50,
        catch_up_after_reconnect_seconds=round(catch_up_seconds, 2),
        fallback_tick_seconds=TICK,
        backends_terminated_in_storm=terminated,
        all_dispatched_after_storm_seconds=round(settle_seconds, 2),
    )
