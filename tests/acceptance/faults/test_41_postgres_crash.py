"""Scenario 41: PostgreSQL crashes under load, losing what it had not flushed.

Steady load over the five domains, one dispatcher with its recovery loops
(short stale thresholds), two project workers, the local provider (20 ms per
call), all on a private PostgreSQL and Redis. Meanwhile the server is crashed
``CRASHES`` times (``pg_ctl stop -m immediate``: every backend gets SIGQUIT,
no checkpoint, WAL still in shared buffers is gone) and started again after a
seeded 0.3-1.2 s (``PF_FAULTS_CRASH_DOWN_MAX`` for longer); each start replays the WAL.

What such a crash may lose is exactly what the project commits without
waiting for the WAL flush: claims and marks (``store.claim.ASYNC_COMMIT``),
the ledger's settle of a successful call, the recovery child's actions. Each
of those is documented as recoverable; this scenario checks it end to end.
Every submit the producer saw commit is durable (synchronous commit), so none
may be lost; a submit that failed with the crash may or may not have
committed, and is counted either way.

Then the system must settle: every job succeeded within ``SETTLE_BOUND`` (each
outage is shorter than ``WORKER_DB_OUTAGE_WAIT``: a worker that knows an
outcome or a vendor's answer saves it once the server is back, and a job taken
meanwhile starts then),
the suite's invariants (one envelope per attempt, at most one execution per
attempt), and the vendor-call checks of scenario 40 (every call recorded
first, no non-retry-safe call taking effect twice). The processes must all be
alive: nothing here needs an outside supervisor.
"""

import json
import os
import random
import time

import pytest

from tests.acceptance.faults import invariants, vendor_ledger
from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts
from tests.acceptance.faults.test_40_mixed_chaos import (
    DOMAINS,
    RECOVERY,
    SETTLE_BOUND,
    Load,
    check_submits,
    wait_settled,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(300)]

CRASHES = int(os.environ.get("PF_FAULTS_CRASHES") or 3)
SEED = int(os.environ.get("PF_FAULTS_CHAOS_SEED") or 41)
# Longest outage (s); past WORKER_DB_OUTAGE_WAIT (15 s) jobs are left to recovery, which this scenario does not expect.
DOWN_MAX = float(os.environ.get("PF_FAULTS_CRASH_DOWN_MAX") or 1.2)
LOAD_PERIOD = 0.25  # one job per domain: 20 jobs/s


def test_postgres_crashes_lose_no_committed_job_and_repeat_no_vendor_call(private_stack, private_postgres):
    stack = private_stack
    # The private server runs without durability (speed); this scenario is about what a crash loses, so every
    # session here commits as a production server does by default, and the project's own asynchronous commits
    # (set per transaction) are the only ones a crash can take.
    database = stack.scalar("SELECT current_database()")
    stack.sql(f'ALTER DATABASE "{database}" SET synchronous_commit = on')
    call_log = stack.tmp / "vendor-calls.log"
    env = {
        "DISPATCH_PROVIDER_LATENCY_MS": 20,
        "DISPATCH_SEND_BACKOFF_BASE": 0.1,
        "DISPATCH_RECOVERY": json.dumps(RECOVERY),
        "DISPATCH_RECONNECT_BACKOFF_MAX": 1,
        "PRODUCTFLOW_PROVIDER_CALL_LOG": call_log,
        "DISPATCH_WORKER_HEARTBEAT_INTERVAL": 0.5,
        **short_redis_timeouts(stack.redis_url, 0.5),
    }
    dispatcher = stack.dispatcher("--poll-interval", "1", "--lease", "3", recovery=True, **env)
    workers = [stack.worker(*DOMAINS, name=f"worker{slot}", **env) for slot in range(2)]
    rng = random.Random(SEED)
    load = Load(stack, period=LOAD_PERIOD, tolerant=True)
    load.start()
    downtime = []
    try:
        for _ in range(CRASHES):
            time.sleep(rng.uniform(1.5, 3.0))
            stack.check_alive()
            private_postgres.stop("immediate")
            down = rng.uniform(0.3, DOWN_MAX)
            time.sleep(down)
            private_postgres.start()
            downtime.append(round(down, 2))
        time.sleep(2.0)
    finally:
        load.stop.set()
        load.join(timeout=60)
    print(f"\nCRASH seed={SEED} crashes={CRASHES} down={downtime} in_doubt={load.in_doubt}")
    last_crash_over = time.monotonic()

    settled_seconds = wait_settled(stack, last_crash_over, f"the last crash (seed {SEED})")
    stack.check_alive()  # every process rode out every crash on its own
    for proc in workers:
        proc.stop()
    assert dispatcher.stop() == 0, dispatcher.output()[-4000:]

    present = check_submits(stack, load)
    calls = vendor_ledger.check(stack, call_log)
    unknown = vendor_ledger.bounded_unknowns(stack)
    report = invariants.check_stack(stack, expected_jobs=present, expect_status=None)
    # Every outage is shorter than WORKER_DB_OUTAGE_WAIT: a worker saves what it knows once the server is back,
    # so no call is left in doubt and no job needs recovery's verdict (the provider never fails here).
    assert not unknown, unknown
    assert report.by_status == {"succeeded": present}, report.by_status
    events = dict(stack.sql("SELECT kind, count(*) FROM dispatch_app_jobevent GROUP BY 1"))
    resent = stack.scalar("SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE send_attempts > 1")
    record_figures(
        "41_postgres_crash",
        **report.figures(),
        seed=SEED,
        crashes=CRASHES,
        seconds_down=downtime,
        submits_acknowledged=len(load.ids),
        submits_in_doubt=load.in_doubt,
        in_doubt_that_committed=present - len(load.ids),
        vendor_calls_reached=len(calls.reached),
        envelopes_sent_more_than_once=resent,
        all_terminal_after_last_crash_seconds=round(settled_seconds, 1),
        settle_bound_seconds=SETTLE_BOUND,
        outcome_unknown=[f"{domain}: {error}" for domain, error in unknown],
        events=events,
    )
