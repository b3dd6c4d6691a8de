"""Scenario 9: SIGTERM while sends are in flight (private Redis, held with ``DEBUG SLEEP``).

A batch of 500 is claimed and its first two chunks (SEND_CONCURRENCY=2, 50 per
chunk) are stuck in Redis when SIGTERM arrives:

- no new claim starts (the signal waits until both sends have begun: the
  ``note_send`` failpoint says so, and Redis is seen still held); the chunks in flight finish when Redis answers and are
  marked; the chunks not started are released (claimable at once, the attempt
  not counted); the process exits 0 within its deadline;
- a second signal exits at once (exit 1), leases and all;
- after a restart everything is delivered and every job runs once.
"""

import signal
import threading
import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(150)]

# The lease must outlast the worst case of a batch's sends (conf.check_lease): 10 chunks in 5 waves of 2, each
# up to the 5 s socket timeout = 25 s; the restart below moves the forced exit's lease end to now.
JOBS, BATCH, CHUNK, CONCURRENCY, DEADLINE, LEASE = 2000, 500, 50, 2, 8.0, 80.0


def hold_redis(private_redis, seconds: float) -> threading.Thread:
    """Block the private Redis server for ``seconds`` (every client's call waits)."""
    client = private_redis.client(socket_timeout=seconds + 10)
    thread = threading.Thread(target=client.execute_command, args=("DEBUG", "SLEEP", seconds), daemon=True)
    thread.start()
    return thread


def leased(stack) -> int:
    return stack.scalar("SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE lease_token IS NOT NULL")


def sends_begun(notes, pid: int) -> int:
    if not notes.exists():
        return 0
    return notes.read_text().splitlines().count(f"note_send {pid}")


def dispatcher_args():
    return ("--batch-size", str(BATCH), "--concurrency", str(CONCURRENCY), "--shutdown-deadline", str(DEADLINE))


def test_sigterm_mid_batch_finishes_or_releases_and_a_second_signal_exits_at_once(private_redis_stack, private_redis):
    stack = private_redis_stack
    notes = stack.tmp / "failpoint.notes"
    env = {
        "DISPATCH_SEND_CHUNK_SIZE": CHUNK,
        "PRODUCTFLOW_FAILPOINTS": "note_send",
        "PRODUCTFLOW_FAILPOINT_NOTES": notes,
    }

    # --- one SIGTERM ----------------------------------------------------------
    stack.submit(JOBS, prefix="s9")
    held = hold_redis(private_redis, 5)
    # Its start-up catch-up scan claims a full batch at once, and the sends hang in Redis.
    first = stack.dispatcher(*dispatcher_args(), "--lease", str(LEASE), name="dispatcher-sigterm", **env)
    wait_until(lambda: leased(stack) == BATCH, timeout=20, message="a claimed batch stuck in Redis")
    # The claim commits before the loop hands its chunks to the sends: signalled at the lease, a slow host
    # could stop the loop before the second send began (then one chunk is in flight, rightly).
    wait_until(lambda: sends_begun(notes, first.pid) >= CONCURRENCY, timeout=20, message="both sends begun")
    assert held.is_alive(), "Redis answered before the signal: the sends were not held in flight"
    signalled = time.monotonic()
    first.send(signal.SIGTERM)
    rc = first.wait(timeout=DEADLINE + 10)
    stop_seconds = time.monotonic() - signalled
    held.join(timeout=10)
    assert rc == 0, first.output()
    assert stop_seconds <= DEADLINE, f"stopped after {stop_seconds:.1f}s, deadline {DEADLINE}s"

    assert leased(stack) == 0, "every lease was either marked or released"
    dispatched = stack.count_envelopes("dispatched")
    claimed = stack.scalar("SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE send_attempts > 0")
    assert dispatched == CHUNK * CONCURRENCY, f"the in-flight chunks finished and were marked: {dispatched}"
    assert claimed == dispatched, "no claim after the signal; released envelopes do not count an attempt"
    available_now = stack.scalar(
        "SELECT count(*) FROM dispatch_app_dispatchenvelope "
        "WHERE status = 'pending' AND available_at <= clock_timestamp()"
    )
    assert available_now == JOBS - dispatched, "released envelopes are claimable at once"

    # --- a second signal ------------------------------------------------------
    held = hold_redis(private_redis, 6)
    second = stack.dispatcher(*dispatcher_args(), "--lease", str(LEASE), name="dispatcher-double-signal", **env)
    wait_until(lambda: leased(stack) == BATCH, timeout=20, message="the second dispatcher's batch stuck in Redis")
    second.send(signal.SIGTERM)
    wait_until(lambda: "stopping (deadline" in second.output(), timeout=5, message="the first signal handled")
    signalled = time.monotonic()
    second.send(signal.SIGTERM)
    rc = second.wait(timeout=10)
    forced_seconds = time.monotonic() - signalled
    assert rc == 1, second.output()
    assert forced_seconds < 2, f"the second signal took {forced_seconds:.1f}s"
    assert held.is_alive(), "it exited while its sends were still stuck, not after them"
    assert "second signal: exiting at once" in second.output()
    held.join(timeout=15)

    # --- restart: the rest is delivered, each job runs once ------------------
    # The forced exit left its batch leased; its lease running out (scenario 2 shows that by the clock) is
    # skipped here: the database clock moves it to now.
    stack.sql(
        "UPDATE dispatch_app_dispatchenvelope SET available_at = clock_timestamp() "
        "WHERE status = 'pending' AND lease_token IS NOT NULL"
    )
    restarted_at = time.monotonic()
    third = stack.dispatcher(*dispatcher_args(), "--lease", str(LEASE), name="dispatcher-restart", **env)
    worker = stack.worker("delivery")
    stack.wait_all("dispatched", JOBS, timeout=60, what="envelopes")
    delivered_after = time.monotonic() - restarted_at
    stack.wait_all("succeeded", JOBS, timeout=90)
    assert third.stop() == 0, third.output()
    worker.stop()
    report = invariants.check_stack(stack, expected_jobs=JOBS)
    record_figures(
        "09_shutdown_mid_batch",
        **report.figures(),
        sigterm_exit_seconds=round(stop_seconds, 2),
        shutdown_deadline_seconds=DEADLINE,
        in_flight_marked=dispatched,
        released_unsent=BATCH - dispatched,
        second_signal_exit_seconds=round(forced_seconds, 2),
        all_dispatched_after_restart_seconds=round(delivered_after, 2),
    )
