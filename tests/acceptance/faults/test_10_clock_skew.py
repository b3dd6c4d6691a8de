"""Scenario 10: the dispatcher's host clock is far off (three days ahead, then three days behind).

The clock is shifted inside the child processes (``PF_FAULTS_CLOCK_OFFSET``:
time.time, time.time_ns and datetime.now/utcnow/today; their log timestamps show
it). Leases, delays and recovery thresholds are computed by PostgreSQL, so:

- a dispatcher three days ahead does not claim an envelope delayed by 4 s early;
- the lease it takes before being killed runs out after LEASE seconds of
  database time: a dispatcher three days behind re-claims exactly then, and
  sends the delayed envelope when it is due, not three days later;
- ``recover --once`` three days ahead finds no stale job among ones queued a
  few seconds ago, and three days behind it still finds them once they are
  stale by the database clock (threshold 0).
"""

import json
import re
import signal
import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(150)]

DAYS3 = 3 * 86_400
LEASE, DELAY = 3.0, 4.0


def test_leases_delays_and_thresholds_follow_the_database_clock(shared_stack, redis_conn):
    stack = shared_stack
    now_ids = stack.submit(20, prefix="now")
    delayed = stack.submit(5, prefix="delayed", delay=DELAY)
    unattended = stack.submit(10, domain="workflow", prefix="wf")  # no workflow worker yet
    worker = stack.worker("delivery")

    ahead = stack.dispatcher(
        "--lease",
        str(LEASE),
        PF_FAULTS_CLOCK_OFFSET=DAYS3,
        PRODUCTFLOW_FAILPOINTS="kill_after_send",
        name="ahead",
        **short_redis_timeouts(stack.redis_url, 0.5),  # a 3 s lease must outlast a send
    )
    assert ahead.wait(timeout=30) == -signal.SIGKILL, ahead.output()
    assert f"PF_FAULTS clock offset +{DAYS3}s active" in ahead.output()
    claimed = stack.sql(
        "SELECT job_id, available_at FROM dispatch_app_dispatchenvelope WHERE send_attempts = 1 ORDER BY job_id"
    )
    assert sorted(r[0] for r in claimed) == sorted(now_ids + unattended), "the delayed envelopes were not due yet"
    lease_end = min(r[1] for r in claimed)
    due = dict(
        stack.sql("SELECT job_id, available_at FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s)", [delayed])
    )
    lease_taken = stack.scalar(
        "SELECT extract(epoch FROM min(available_at) - clock_timestamp()) FROM dispatch_app_dispatchenvelope "
        "WHERE send_attempts = 1"
    )
    assert float(lease_taken) <= LEASE, f"a lease of {lease_taken}s left: computed from the host clock?"

    behind = stack.dispatcher(
        "--lease",
        str(LEASE),
        "--poll-interval",
        "0.5",
        PF_FAULTS_CLOCK_OFFSET=-DAYS3,
        **short_redis_timeouts(stack.redis_url, 0.5),
    )
    stack.wait_all("dispatched", 35, timeout=30, what="envelopes")
    first_redispatch = stack.scalar(
        "SELECT min(dispatched_at) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s)", [now_ids + unattended]
    )
    assert first_redispatch >= lease_end, "re-claimed before the lease ran out"
    sent = dict(
        stack.sql("SELECT job_id, dispatched_at FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s)", [delayed])
    )
    late = [(sent[job] - due[job]).total_seconds() for job in delayed]
    assert all(0 <= after < 5 for after in late), f"sent this long after due: {late}"
    stack.wait_all("succeeded", 25, timeout=60)
    assert behind.stop() == 0, behind.output()
    stop_line = next(line for line in behind.output().splitlines() if "stopping (deadline" in line)
    logged_day = stop_line[:10]
    real_minus_3 = {time.strftime("%Y-%m-%d", time.localtime(time.time() - DAYS3 + d)) for d in (-60, 60)}
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", logged_day) and logged_day in real_minus_3, stop_line

    # Recovery thresholds: the workflow jobs sit queued; their RQ jobs are lost (no evidence left).
    assert (
        redis_conn.delete(*[f"rq:job:{stack.rq_job_id(job_id, 1)}" for job_id in unattended], "rq:queue:workflow") >= 10
    )
    ahead_round = stack.manage("recover", "--once", "--json", "--domain", "workflow", PF_FAULTS_CLOCK_OFFSET=DAYS3)
    assert ahead_round.returncode == 0, ahead_round.stderr
    ahead_summary = json.loads(ahead_round.stdout)["domains"][0]
    assert ahead_summary["scanned"] == 0 and ahead_summary["redispatched"] == 0, ahead_summary
    behind_round = stack.manage(
        "recover",
        "--once",
        "--json",
        "--domain",
        "workflow",
        PF_FAULTS_CLOCK_OFFSET=-DAYS3,
        DISPATCH_RECOVERY=json.dumps({"workflow": {"QUEUED_STALE_SECONDS": 0}}),
    )
    assert behind_round.returncode == 0, behind_round.stderr
    behind_summary = json.loads(behind_round.stdout)["domains"][0]
    assert behind_summary["redispatched"] == 10, behind_summary

    drain = stack.worker("workflow", burst=True, name="workflow-burst")
    assert drain.wait(timeout=60) == 0, drain.output()
    worker.stop()
    report = invariants.check_stack(stack, expected_jobs=35)
    assert {attempt for (job, attempt) in stack.ledger() if job in unattended} == {2}
    record_figures(
        "10_clock_skew",
        **report.figures(),
        host_clock_offsets_days=[3, -3],
        lease_seconds=LEASE,
        redelivered_not_before_lease_end=True,
        delayed_sent_after_due_seconds=[round(a, 2) for a in late],
        recovery_scanned_with_clock_ahead=ahead_summary["scanned"],
        recovery_redispatched_with_clock_behind_threshold_0=behind_summary["redispatched"],
    )
