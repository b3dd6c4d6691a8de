"""Scenario 24: vendor failures and workers killed mid-job repeat no vendor call that took effect (issue 11 item 10).

Steady load over the four domains that call vendors (image_series with 3
images, agent with 3 steps, partial_edit, workflow with 3 steps), the local
provider failing 15 % of calls (``ProviderError``: that call took no effect),
a dispatcher with its recovery loops, two workers, and a seeded schedule that
kills (-9) a worker (``runworkers``, heartbeat 0.5 s, so a killed one is seen
dead after 3 s) mid-job four times and starts a new one. The local provider
keeps a log of every call that reached it (``PRODUCTFLOW_PROVIDER_CALL_LOG``);
the vendor-call ledger says which job and which call each request was.

Invariants, beyond the suite's: every job ends (succeeded, failed or
outcome_unknown) within the bounds; every call the vendor saw was recorded in
the ledger first; and no call of a non-retry-safe domain took effect twice.
"""

import json
import random
import signal
import time
from collections import Counter

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

QUEUES = ("image_series", "partial_edit", "agent", "workflow")
NOT_RETRY_SAFE = ("image_series", "partial_edit", "agent")
LOAD = {
    "image_series": (30, lambda i: {"product_id": f"p{i}", "prompt": f"shot {i}", "count": 3, "size": 8}),
    "agent": (20, lambda i: {"goal": f"caption {i}", "max_steps": 3}),
    "partial_edit": (20, lambda i: {"image": f"img-{i}", "region": [0, 0, 8, 8], "instruction": "brighter"}),
    "workflow": (10, lambda i: {"workflow_id": f"wf-{i}", "steps": ["fetch", "resize", "tag"]}),
}
RECOVERY = {
    domain: {
        "RUNNING_STALE_SECONDS": 3,
        "QUEUED_STALE_SECONDS": 5,
        "VENDOR_EVIDENCE_TRUST_SECONDS": 4,
        "MAX_ATTEMPTS": 10,
        "PERIOD_SECONDS": 0.5,
        "JITTER_SECONDS": 0,
    }
    for domain in QUEUES
}
KILLS, SEED = 4, 24


def test_no_vendor_call_that_took_effect_is_repeated(private_redis_stack):
    stack = private_redis_stack
    call_log = stack.tmp / "vendor-calls.log"
    env = {
        "DISPATCH_PROVIDER_FAILURE_RATE": 0.15,
        "DISPATCH_PROVIDER_LATENCY_MS": 40,
        "DISPATCH_SEND_BACKOFF_BASE": 0.1,
        "DISPATCH_RECOVERY": json.dumps(RECOVERY),
        "PRODUCTFLOW_PROVIDER_CALL_LOG": call_log,
        # A killed worker's hash expires after 6 silent periods (3 s): recovery then sees it dead.
        "DISPATCH_WORKER_HEARTBEAT_INTERVAL": 0.5,
    }
    dispatcher = stack.dispatcher("--poll-interval", "0.2", recovery=True, **env)

    def start_worker():
        return stack.worker(*QUEUES, name="worker", **env)  # the project's worker (runworkers, one process)

    workers = [start_worker() for _ in range(2)]
    from dispatch_app.outbox.submit import JobSpec, submit_many

    specs = [JobSpec(domain, make(i)) for domain, (count, make) in LOAD.items() for i in range(count)]
    random.Random(SEED).shuffle(specs)
    jobs = [job.pk for job in submit_many(specs)]

    rng = random.Random(SEED)
    kills = 0
    while kills < KILLS:
        time.sleep(rng.uniform(0.5, 1.5))
        stack.check_alive()
        if not stack.scalar("SELECT count(*) FROM dispatch_app_job WHERE status = 'running'"):
            continue  # mid-job kills only
        index = rng.randrange(len(workers))
        victim = workers[index]
        victim.send(signal.SIGKILL)
        victim.wait(timeout=10)
        workers[index] = start_worker()
        kills += 1

    active = "SELECT count(*) FROM dispatch_app_job WHERE status IN ('submitted', 'queued', 'running')"
    started = time.monotonic()
    wait_until(lambda: stack.check_alive() or stack.scalar(active) == 0, timeout=120, message="every job finished")
    finished_after_kills = time.monotonic() - started
    for proc in workers:
        proc.stop()
    assert dispatcher.stop() == 0, dispatcher.output()

    ledger = {
        request_id: (job_id, seq, domain)
        for request_id, job_id, seq, domain in stack.sql(
            "SELECT v.request_id, v.job_id, v.seq, j.domain FROM dispatch_app_vendorcall v "
            "JOIN dispatch_app_job j ON j.id = v.job_id"
        )
    }
    lines = [line.split() for line in call_log.read_text().splitlines()]
    reached = [(op, request_id, outcome) for op, request_id, outcome, _pid in lines]
    unrecorded = [r for r in reached if r[1] not in ledger]
    assert not unrecorded, f"vendor calls made without a ledger record: {unrecorded[:5]}"
    took_effect = Counter(ledger[request_id] for _op, request_id, outcome in reached if outcome == "succeeded")
    repeated = {key: n for key, n in took_effect.items() if n > 1 and key[2] in NOT_RETRY_SAFE}
    assert not repeated, f"non-retry-safe vendor calls that took effect more than once: {repeated}"

    by_status = dict(stack.sql("SELECT status, count(*) FROM dispatch_app_job GROUP BY 1"))
    # outcome_unknown only for a call really in doubt: one the vendor cannot be asked about, or past the trust bound.
    unknown = stack.sql("SELECT domain, error FROM dispatch_app_job WHERE status = 'outcome_unknown'")
    for domain, error in unknown:
        assert "cannot be asked" in error or "trust bound" in error, (domain, error)
    vendor_failures = sum(1 for _op, _r, outcome in reached if outcome == "failed")
    retries = stack.scalar("SELECT count(*) FROM dispatch_app_jobevent WHERE kind = 'retry_after_failure'")
    # What a from-the-top retry would have billed again: calls that took effect in an attempt that was retried.
    spared = stack.scalar(
        "SELECT count(*) FROM dispatch_app_vendorcall v JOIN dispatch_app_job j ON j.id = v.job_id "
        "WHERE v.status = 'succeeded' AND j.domain = ANY(%s) AND EXISTS (SELECT 1 FROM dispatch_app_jobevent e "
        "WHERE e.job_id = v.job_id AND e.attempt = v.attempt AND e.kind IN ('retry_after_failure', "
        "'recovery_redispatch'))",
        [list(NOT_RETRY_SAFE)],
    )
    assert vendor_failures and retries and spared, (vendor_failures, retries, spared)  # the scenario did bite
    assert by_status.get("succeeded", 0) >= len(jobs) // 2, by_status
    report = invariants.check_stack(stack, expected_jobs=len(jobs), expect_status=None)
    events = dict(stack.sql("SELECT kind, count(*) FROM dispatch_app_jobevent GROUP BY 1"))
    record_figures(
        "24_vendor_failures_chaos",
        **report.figures(),
        workers_killed_mid_job=KILLS,
        vendor_calls_reached=len(reached),
        vendor_failures=vendor_failures,
        retries_after_failure=retries,
        repeated_non_retry_safe_calls=0,
        calls_a_from_the_top_retry_would_have_repeated=spared,
        all_finished_after_last_kill_seconds=round(finished_after_kills, 1),
        outcome_unknown=[f"{domain}: {error}" for domain, error in unknown],
        events=events,
    )
