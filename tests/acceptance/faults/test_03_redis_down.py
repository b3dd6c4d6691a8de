"""Scenario 3: Redis is down while jobs are submitted (private redis-server).

While it is down nothing is marked dispatched, the dispatcher pauses (an
unreachable Redis is an outage, never the envelopes' fault: they are given back
without counting the attempt, with a bounded delay) and probes with one envelope
at a time, it does not spin (CPU stays low), and nothing goes dead; once Redis
is back every job is delivered and executed once.
"""

import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(150)]

BEFORE, DURING = 50, 300
BATCH = 100  # DISPATCH BATCH_SIZE (default)
BACKOFF_BASE, BACKOFF_MAX, POLL = 0.2, 1.0, 0.5
CPU_WINDOW = 4.0


def test_redis_down_backs_off_without_spinning_then_delivers_everything(private_redis_stack, private_redis):
    stack = private_redis_stack
    dispatcher = stack.dispatcher(
        "--poll-interval",
        str(POLL),
        "--lease",
        "10",
        DISPATCH_SEND_BACKOFF_BASE=BACKOFF_BASE,
        DISPATCH_SEND_BACKOFF_MAX=BACKOFF_MAX,
        DISPATCH_MAX_SEND_ATTEMPTS=1,  # an outage never counts: one counted failure would be dead at once
        **short_redis_timeouts(stack.redis_url, 1.0),  # the 10 s lease must outlast a send
    )
    worker = stack.worker("delivery")
    stack.submit(BEFORE, prefix="before")
    stack.wait_all("succeeded", BEFORE, timeout=60)
    worker.stop()

    private_redis.stop()
    down_at = time.monotonic()
    outage_ids = stack.submit(DURING, prefix="during")
    # The first batch was given back, and at least two one-envelope probes since: the dispatcher is probing.
    wait_until(
        lambda: (
            stack.scalar(
                "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) "
                "AND last_error LIKE 'dispatch paused: Redis unreachable%%'",
                [outage_ids],
            )
            >= BATCH + 2
        ),
        timeout=30,
        message="a given-back batch and two probes",
    )
    cpu_before = dispatcher.cpu_seconds()
    window_start = time.monotonic()
    # A fixed observation window is the measurement itself (CPU over time), not a wait for an effect.
    time.sleep(CPU_WINDOW)
    cpu_share = (dispatcher.cpu_seconds() - cpu_before) / (time.monotonic() - window_start)

    marked = stack.scalar(
        "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND status <> 'pending'",
        [outage_ids],
    )
    queued = stack.scalar(
        "SELECT count(*) FROM dispatch_app_job WHERE id = ANY(%s) AND status <> 'submitted'", [outage_ids]
    )
    furthest = stack.scalar(
        "SELECT extract(epoch FROM max(available_at) - clock_timestamp()) FROM dispatch_app_dispatchenvelope "
        "WHERE job_id = ANY(%s) AND lease_token IS NULL",
        [outage_ids],
    )
    attempts = stack.scalar(
        "SELECT max(send_attempts) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND lease_token IS NULL",
        [outage_ids],
    )
    down_seconds = time.monotonic() - down_at
    assert marked == 0, "nothing is marked dispatched (or dead) while Redis is down"
    assert queued == 0
    assert furthest is not None and float(furthest) <= BACKOFF_MAX + 0.5, f"backoff beyond its cap: {furthest}s"
    # The outage is not the envelopes' fault: no attempt of theirs was counted (one in flight may be leased).
    assert attempts == 0, f"an outage counted {attempts} send attempts against an envelope"
    assert cpu_share < 0.25, f"dispatcher used {cpu_share:.0%} CPU while Redis was down (spinning?)"
    assert dispatcher.alive()

    private_redis.start()
    back_at = time.monotonic()
    stack.wait_all("dispatched", BEFORE + DURING, timeout=30, what="envelopes")
    delivered_after = time.monotonic() - back_at
    worker = stack.worker("delivery", name="worker-after")
    stack.wait_all("succeeded", BEFORE + DURING, timeout=60)
    assert delivered_after <= BACKOFF_MAX + POLL + 5, f"took {delivered_after:.1f}s after Redis came back"
    assert dispatcher.stop() == 0, dispatcher.output()
    worker.stop()

    assert stack.count_envelopes("dead") == 0
    report = invariants.check_stack(stack, expected_jobs=BEFORE + DURING)
    record_figures(
        "03_redis_down",
        **report.figures(),
        redis_down_seconds=round(down_seconds, 1),
        dispatcher_cpu_share_while_down=round(cpu_share, 3),
        max_send_attempts_while_down=attempts,
        furthest_retry_seconds=round(float(furthest), 2),
        all_dispatched_after_redis_back_seconds=round(delivered_after, 2),
    )
