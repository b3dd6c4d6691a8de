"""Scenario 3: Redis is down while jobs are submitted (private redis-server).

While it is down nothing is marked dispatched, the failed sends back off with a
bounded delay, the dispatcher does not spin (CPU stays low), and nothing goes
dead; once Redis is back every job is delivered and executed once.
"""

import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(150)]

BEFORE, DURING = 50, 300
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
        DISPATCH_MAX_SEND_ATTEMPTS=1000,
    )
    worker = stack.worker("delivery")
    stack.submit(BEFORE, prefix="before")
    stack.wait_all("succeeded", BEFORE, timeout=60)
    worker.stop()

    private_redis.stop()
    down_at = time.monotonic()
    outage_ids = stack.submit(DURING, prefix="during")
    # Every outage envelope has been tried and failed at least twice: the dispatcher is retrying.
    wait_until(
        lambda: (
            stack.scalar(
                "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND send_attempts >= 2",
                [outage_ids],
            )
            == DURING
        ),
        timeout=30,
        message="every outage envelope retried",
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
        "SELECT max(send_attempts) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s)", [outage_ids]
    )
    down_seconds = time.monotonic() - down_at
    assert marked == 0, "nothing is marked dispatched (or dead) while Redis is down"
    assert queued == 0
    assert furthest is not None and float(furthest) <= BACKOFF_MAX + 0.5, f"backoff beyond its cap: {furthest}s"
    # Bounded retries: about one per capped backoff, not one per loop iteration.
    assert attempts <= down_seconds / BACKOFF_MAX + 8, f"{attempts} send attempts in {down_seconds:.1f}s"
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
