"""Scenario 46: a recovery storm through scenario 40's chaos (issue 30, item 4).

Before anything starts, STALE_PER_DOMAIN jobs per domain sit ``queued`` an hour
ago with their RQ jobs gone (what a long Redis outage leaves). Then scenario
40's stack, load and seeded fault schedule (kill -9 dispatchers and workers,
terminate the app's backends, restart Redis empty) run while recovery works
the storm off through the domains' recovery lanes (``dispatch_app.domains.lanes``).

Checked: none lost, one envelope per attempt, at most one execution per
attempt, no vendor call of a non-retry-safe domain repeated; every stale job
was re-dispatched into its recovery lane (never into the new jobs' queue) and
handled: the last first re-dispatch of a stale job came within
STORM_BOUND of the start, and every job is terminal within scenario 40's
settle bound after the last fault.
"""

import math
import random
import time

import pytest

from dispatch_app.config.settings import SPECS
from tests.acceptance.faults import invariants, vendor_ledger
from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.test_11_recovery_herd import PAYLOAD_SQL
from tests.acceptance.faults.test_40_mixed_chaos import (
    ACTIVE,
    CHAOS_SECONDS,
    DOMAINS,
    FAULTS,
    RECOVERY,
    RECOVERY_FLOOR_SECONDS,
    SEED,
    Chaos,
    Load,
    chaos_env,
    plan_schedule,
    wait_settled,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(600)]

STALE_PER_DOMAIN = 100
BATCH = 25
PERIOD = RECOVERY["delivery"]["PERIOD_SECONDS"]
# The documented bound (README, "Pacing"): while new work is slowed (and the chaos slows it: killed workers,
# Redis restarts) recovery's pacer cuts a round to RECOVERY_PACE_MIN_SHARE of its cap, never below, per
# RECOVERY_PACE_FLOOR_SECONDS (scenario 40's environment: one period, time compressed like the periods), so the
# storm takes at most ceil(N / floor) rounds a period apart (17 s here; 2 s with headroom); each dispatcher
# kill restarts its recovery child's loops and each Redis restart fails a round, so the chaos's length on top.
PACED_FLOOR = max(1, math.ceil(BATCH * SPECS["RECOVERY_PACE_MIN_SHARE"].default))  # the stack runs the default
assert RECOVERY_FLOOR_SECONDS <= PERIOD  # the floor owed every round, as the bound says
STORM_BOUND = math.ceil(STALE_PER_DOMAIN / PACED_FLOOR) * PERIOD + CHAOS_SECONDS


def seed_storm(stack) -> list[int]:
    with stack.connect() as conn:
        ids = [
            row[0]
            for row in conn.execute(
                f"""
                INSERT INTO dispatch_app_job (domain, status, attempt, payload, error, vendor_request_id,
                                              submitted_at, dispatched_at, updated_at)
                SELECT d, 'queued', 1, {PAYLOAD_SQL}, '', '',
                       clock_timestamp() - interval '2 hours', clock_timestamp() - interval '2 hours',
                       clock_timestamp() - interval '1 hour' + g * interval '1 ms'
                FROM unnest(%s::text[]) AS d, generate_series(1, %s) AS g
                RETURNING id
                """,
                [list(DOMAINS), STALE_PER_DOMAIN],
            ).fetchall()
        ]
        conn.execute(
            """
            INSERT INTO dispatch_app_dispatchenvelope (job_id, attempt, domain, queue, status, available_at,
                                                       send_attempts, last_error, created_at, dispatched_at)
            SELECT id, 1, domain, domain, 'dispatched', submitted_at, 1, '', submitted_at, dispatched_at
            FROM dispatch_app_job
            """
        )
        conn.execute("ANALYZE dispatch_app_job")
        conn.execute("ANALYZE dispatch_app_dispatchenvelope")
    return ids


def test_a_recovery_storm_through_chaos_loses_nothing_and_uses_the_recovery_lanes(
    private_stack, private_redis, private_postgres
):
    stack = private_stack
    stale = seed_storm(stack)
    assert len(stale) == STALE_PER_DOMAIN * len(DOMAINS)
    started_at = stack.scalar("SELECT extract(epoch FROM clock_timestamp())")
    call_log = stack.tmp / "vendor-calls.log"
    env = chaos_env(stack, call_log)

    def start_dispatcher(slot: int):
        return stack.dispatcher("--poll-interval", "1", "--lease", "3", name=f"dispatcher{slot}", recovery=True, **env)

    def start_worker(slot: int):
        return stack.worker(*DOMAINS, name=f"worker{slot}", **env)

    dispatchers = [start_dispatcher(i) for i in range(2)]
    workers = [start_worker(i) for i in range(2)]
    rng = random.Random(SEED + 2)
    schedule = plan_schedule(rng, CHAOS_SECONDS)
    print(f"\nSTORM CHAOS seed={SEED + 2} seconds={CHAOS_SECONDS} schedule={schedule}")
    assert set(kind for _at, kind in schedule) == set(FAULTS)
    load = Load(stack)
    load.start()
    try:
        chaos = Chaos(stack, private_redis, private_postgres, rng, start_dispatcher, start_worker)
        chaos.run(schedule, dispatchers, workers, load)
    finally:
        load.stop.set()
        load.join(timeout=60)
    assert load.error is None, load.error
    settled_seconds = wait_settled(stack, time.monotonic(), "the last fault of the storm's chaos")
    for proc in workers:
        proc.stop()
    for proc in dispatchers:
        assert proc.stop() == 0, proc.output()[-4000:]

    vendor_ledger.check(stack, call_log)
    present = {job_id for (job_id,) in stack.sql("SELECT id FROM dispatch_app_job")}
    assert present == set(load.ids) | set(stale), "a job was lost, or one appeared that nobody submitted"
    report = invariants.check_stack(stack, expected_jobs=len(present), expect_status=None)
    assert stack.scalar(ACTIVE) == 0
    # Every stale job went through recovery, into its domain's recovery lane, never into the new jobs' queue.
    lanes_used = dict(
        stack.sql(
            "SELECT queue LIKE '%%.recovery', count(DISTINCT job_id) FROM dispatch_app_dispatchenvelope "
            "WHERE job_id = ANY(%s) AND attempt > 1 GROUP BY 1",
            [stale],
        )
    )
    assert lanes_used.get(True) == len(stale), lanes_used
    first_redispatch = stack.sql(
        "SELECT max(first) - %s FROM (SELECT min(extract(epoch FROM at)) AS first "
        "FROM dispatch_app_jobevent WHERE kind = 'recovery_redispatch' AND job_id = ANY(%s) GROUP BY job_id) s",
        [started_at, stale],
    )[0][0]
    assert float(first_redispatch) <= STORM_BOUND, f"the storm took {first_redispatch:.1f}s > {STORM_BOUND}s"
    new_in_recovery_lane = stack.scalar(
        "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND attempt = 1 "
        "AND queue LIKE '%%.recovery'",
        [load.ids],
    )
    assert new_in_recovery_lane == 0
    record_figures(
        "46_recovery_storm_chaos",
        **report.figures(),
        seed=SEED + 2,
        stale_jobs=len(stale),
        new_jobs=len(load.ids),
        faults=dict(chaos.done),
        worker_kills_with_a_job_running=chaos.mid_job_kills,
        storm_redispatched_within_seconds=round(float(first_redispatch), 1),
        storm_bound_seconds=STORM_BOUND,
        all_terminal_after_last_fault_seconds=round(settled_seconds, 1),
    )
