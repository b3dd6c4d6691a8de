"""Scenario 4: Redis loses its data after dispatch (the private redis-server restarts without persistence).

1,000 jobs over the five domains are dispatched while no worker runs, so they
sit on RQ queues (``queued`` in PostgreSQL); 100 others already finished. Redis
restarts empty. ``manage.py recover --once`` finds every job that is not
terminal in PostgreSQL, sees its RQ job missing before it ever started, and
re-dispatches it as the next attempt through the outbox; the finished ones are
not touched. Workers then run each job exactly once (attempt 2).
"""

import json
import time

import pytest

from dispatch_app.domains import get_domain
from dispatch_app.domains.demo_payloads import demo_domain_keys
from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures

pytestmark = [pytest.mark.acceptance, pytest.mark.slow, pytest.mark.timeout(180)]

# The shipped domains (those with a demo payload), as declared in the registry.
DOMAINS = tuple(demo_domain_keys())
PER_DOMAIN, DONE = 200, 100
ALL_QUEUES = tuple(get_domain(d).queue for d in DOMAINS)


def test_recovery_redispatches_every_unfinished_job_after_redis_data_loss(private_stack, private_redis):
    stack = private_stack
    done = stack.submit(DONE, prefix="done")
    dispatcher = stack.dispatcher("--batch-size", "500")
    worker = stack.worker("delivery", name="worker-before")
    stack.wait_all("succeeded", DONE, timeout=60)
    worker.stop()

    waiting = []
    for domain in DOMAINS:
        waiting += stack.submit(PER_DOMAIN, domain=domain, prefix=f"s4-{domain}")
    total = DONE + len(waiting)
    stack.wait_all("dispatched", total, timeout=60, what="envelopes")
    assert dispatcher.stop() == 0, dispatcher.output()
    assert stack.count_jobs("queued") == len(waiting)
    assert private_redis.client().llen("rq:queue:workflow") == PER_DOMAIN

    private_redis.stop()
    private_redis.start()
    lost_at = time.monotonic()
    assert private_redis.client().dbsize() == 0, "Redis came back empty"

    overrides = {domain: {"QUEUED_STALE_SECONDS": 0, "BATCH_SIZE": 250} for domain in DOMAINS}
    recovered = stack.manage("recover", "--once", "--json", DISPATCH_RECOVERY=json.dumps(overrides))
    recover_seconds = time.monotonic() - lost_at
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    summary = json.loads(recovered.stdout)
    by_domain = {row["domain"]: row for row in summary["domains"]}
    for domain in DOMAINS:
        row = by_domain[domain]
        assert row["redispatched"] == PER_DOMAIN, row
        assert row["scanned"] == PER_DOMAIN and not row["has_more"], row
    assert summary["dispatch"]["dispatched"] == len(waiting), summary["dispatch"]

    workers = [stack.worker(*ALL_QUEUES, name=f"worker-after-{i}") for i in range(2)]
    stack.wait_all("succeeded", total, timeout=120)
    all_done_seconds = time.monotonic() - lost_at
    for worker in workers:
        worker.stop()

    attempts = dict(stack.sql("SELECT attempt, count(*) FROM dispatch_app_job GROUP BY attempt"))
    assert attempts == {1: DONE, 2: len(waiting)}, attempts
    assert stack.scalar("SELECT count(*) FROM dispatch_app_job WHERE id = ANY(%s) AND attempt <> 1", [done]) == 0
    events = dict(stack.sql("SELECT kind, count(*) FROM dispatch_app_jobevent GROUP BY kind"))
    report = invariants.check_stack(stack, expected_jobs=total)
    assert set(stack.ledger()) == {(job, 1) for job in done} | {(job, 2) for job in waiting}
    record_figures(
        "04_redis_data_lost",
        **report.figures(),
        lost_from_redis=len(waiting),
        redispatched_by_recovery=sum(by_domain[d]["redispatched"] for d in DOMAINS),
        finished_jobs_touched=0,
        recover_once_seconds=round(recover_seconds, 2),
        all_succeeded_after_loss_seconds=round(all_done_seconds, 1),
        events=events,
    )
