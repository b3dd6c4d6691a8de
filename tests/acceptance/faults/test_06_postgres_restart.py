"""Scenario 6: the (private) PostgreSQL server is stopped and started under the running daemon.

Every session dies at once: the listener's, the dispatch loop's, the other
loops' and the main thread's. The daemon keeps running through the outage,
reconnects with a bounded backoff, and what is submitted after the restart is
dispatched well before the fallback tick (30 s here): the listener's catch-up
scan or its NOTIFY wakes the dispatch loop. The backlog is big enough that the
server usually goes away mid-drain: the batches claimed but not yet marked then
come back when their lease (2 s) runs out, because the catch-up claim saw when
those leases fall due and the loop wakes for them (not at the tick), as
recognised duplicates; the figures say how many did. Afterwards the daemon
stops cleanly and every job runs once.
"""

import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.slow, pytest.mark.timeout(180)]

TICK = 30.0
BACKLOG = 5000


def test_daemon_survives_a_postgres_restart(private_stack, private_postgres):
    stack = private_stack
    dispatcher = stack.dispatcher(
        "--poll-interval",
        str(TICK),
        "--lease",
        "2",
        "--batch-size",
        "50",
        DISPATCH_RECONNECT_BACKOFF_MAX=1,
        **short_redis_timeouts(stack.redis_url, 0.5),  # a 2 s lease must outlast a send
    )
    stack.submit(20, prefix="before")
    stack.wait_all("dispatched", 20, timeout=20, what="envelopes")
    # A backlog submitted just before the server goes away.
    stack.submit(BACKLOG, prefix="backlog")
    stack.close_submitter()

    private_postgres.stop("fast")
    down_at = time.monotonic()
    wait_until(
        lambda: dispatcher.output().count("listener connection lost") >= 4,
        timeout=20,
        message="the listener to notice the outage and fail a reconnect",
    )
    assert dispatcher.alive(), "the daemon keeps running while PostgreSQL is down"
    private_postgres.start()
    up_at = time.monotonic()
    after_ids = stack.submit(100, prefix="after")
    submitted_at = time.monotonic()
    total = 20 + BACKLOG + 100
    # Half a tick: a tick that happens to fall early cannot pass for the catch-up and the due wakes.
    stack.wait_all("dispatched", total, timeout=TICK / 2, what="envelopes")
    all_dispatched = time.monotonic()
    after_latency = stack.scalar(
        "SELECT extract(epoch FROM max(dispatched_at - created_at)) FROM dispatch_app_dispatchenvelope "
        "WHERE job_id = ANY(%s)",
        [after_ids],
    )
    assert float(after_latency) < TICK / 3, f"jobs submitted after the restart waited {after_latency}s: the tick?"

    worker = stack.worker("delivery")
    stack.wait_all("succeeded", total, timeout=90)
    assert dispatcher.stop() == 0, dispatcher.output()
    worker.stop()
    output = dispatcher.output()
    assert "Traceback" not in output.split("stopping (deadline")[-1], "the stop after the restart was not clean"

    report = invariants.check_stack(stack, expected_jobs=total)
    reclaimed = stack.scalar("SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE send_attempts > 1")
    record_figures(
        "06_postgres_restart",
        **report.figures(),
        postgres_down_seconds=round(up_at - down_at, 1),
        after_restart_max_outbox_wait_seconds=round(float(after_latency), 2),
        all_dispatched_after_restart_seconds=round(all_dispatched - up_at, 2),
        submit_after_restart_seconds=round(submitted_at - up_at, 2),
        envelopes_reclaimed_after_lease=reclaimed,
        fallback_tick_seconds=TICK,
    )
