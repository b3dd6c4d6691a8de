"""Scenario 11: the recovery herd after an outage — 10,000 stale jobs in every domain.

The state after a long Redis outage is written straight into the (private)
database: 50,000 jobs ``queued`` for an hour whose RQ jobs no longer exist.
One ``rundispatcher`` then runs its five recovery loops next to the dispatch
loop, with a re-dispatch cap per round (``MAX_REDISPATCHES_PER_ROUND``) and a
period. While the herd is worked through, new jobs keep arriving:

- every round stays bounded: at most BATCH_SIZE candidates, at most the cap
  re-dispatched, short in time;
- the re-dispatch rate per domain stays under cap / period;
- new jobs keep their dispatch latency (outbox wait, database clock);
- nothing is lost: every stale job is still there, re-dispatched or waiting
  for a later round; every executed job ran once.
"""

import json
import statistics

import pytest

from dispatch_app.domains.demo_payloads import demo_domain_keys
from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.slow, pytest.mark.timeout(240)]

# The shipped domains (those with a demo payload), as declared in the registry.
DOMAINS = tuple(demo_domain_keys())
STALE_PER_DOMAIN = 10_000
BATCH, CAP, PERIOD = 25, 10, 0.5
ROUNDS_OBSERVED = 12
NEW_PER_STEP = 20

PAYLOAD_SQL = """
CASE d
  WHEN 'workflow' THEN jsonb_build_object('workflow_id', 'wf-' || g, 'steps', jsonb_build_array('fetch'))
  WHEN 'image_series' THEN jsonb_build_object('product_id', 'p-' || g, 'prompt', 'shot ' || g, 'count', 1, 'size', 8)
  WHEN 'delivery' THEN jsonb_build_object('asset', 'stale-' || g, 'target', 'https://t.example.invalid/' || g)
  WHEN 'partial_edit' THEN jsonb_build_object('image', 'img-' || g, 'region', jsonb_build_array(0, 0, 8, 8),
                                              'instruction', 'brighter')
  ELSE jsonb_build_object('goal', 'caption ' || g, 'max_steps', 1)
END
"""


def seed_stale_jobs(stack) -> int:
    """The outage's leftovers: queued an hour ago, dispatched, and gone from Redis."""
    with stack.connect() as conn:
        conn.execute(
            f"""
            INSERT INTO dispatch_app_job (domain, status, attempt, payload, error, vendor_request_id,
                                          submitted_at, dispatched_at, updated_at)
            SELECT d, 'queued', 1, {PAYLOAD_SQL}, '', '',
                   clock_timestamp() - interval '2 hours', clock_timestamp() - interval '2 hours',
                   clock_timestamp() - interval '1 hour' + g * interval '1 ms'
            FROM unnest(%s::text[]) AS d, generate_series(1, %s) AS g
            """,
            [list(DOMAINS), STALE_PER_DOMAIN],
        )
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
        return conn.execute("SELECT count(*) FROM dispatch_app_job").fetchone()[0]


def finished_rounds(stack) -> dict:
    """Finished rounds of the herd's domains (a declared domain outside the herd, e.g. the django.tasks
    queue's, has its own loop at its own period and no stale jobs)."""
    rows = stack.sql(
        "SELECT domain, count(*) FROM dispatch_app_recoveryround WHERE finished_at IS NOT NULL AND domain = ANY(%s) "
        "GROUP BY domain",
        [list(DOMAINS)],
    )
    return dict(rows)


def test_recovery_herd_is_rate_capped_and_new_jobs_keep_their_latency(private_stack):
    stack = private_stack
    stale = seed_stale_jobs(stack)
    assert stale == STALE_PER_DOMAIN * len(DOMAINS)

    overrides = {
        domain: {
            "QUEUED_STALE_SECONDS": 600,
            "BATCH_SIZE": BATCH,
            "MAX_REDISPATCHES_PER_ROUND": CAP,
            "PERIOD_SECONDS": PERIOD,
            "JITTER_SECONDS": 0,
        }
        for domain in DOMAINS
    }
    # The cap alone: the pacer (scenario 46, the recovery-storm benchmark) starts every domain at its floor and cuts
    # rounds below the cap while new work is slowed, which is not what this scenario measures.
    dispatcher = stack.dispatcher(
        recovery=True, DISPATCH_RECOVERY=json.dumps(overrides), DISPATCH_RECOVERY_PACING="false"
    )
    worker = stack.worker("delivery")

    new_ids = []
    step = 0

    def herd_progressed():
        stack.check_alive()
        rounds = finished_rounds(stack)
        return len(rounds) == len(DOMAINS) and min(rounds.values()) >= ROUNDS_OBSERVED

    # New jobs arrive while the herd is being worked: a few at every step of its progress.
    while not herd_progressed():
        new_ids += stack.submit(NEW_PER_STEP, prefix=f"new{step}")
        step += 1
        wait_until(
            lambda s=step: herd_progressed() or min(finished_rounds(stack).values() or [0]) >= s,
            timeout=30,
            message="the next recovery rounds",
        )
        if step > 60:
            break
    stack.wait_all("dispatched", len(new_ids), timeout=30, what="envelopes")  # at least the new ones
    assert dispatcher.stop() == 0, dispatcher.output()
    # Envelopes re-dispatched just before the stop may still be pending: in flight, found by the next dispatcher.
    # Every delivery job whose current attempt reached RQ runs (the delivery worker is the only one).
    wait_until(
        lambda: (
            stack.scalar(
                """
            SELECT count(*) FROM dispatch_app_job j
            JOIN dispatch_app_dispatchenvelope e ON e.job_id = j.id AND e.attempt = j.attempt
            WHERE j.domain = 'delivery' AND e.status = 'dispatched' AND (j.attempt = 2 OR j.id = ANY(%s))
              AND j.status <> 'succeeded'
            """,
                [new_ids],
            )
            == 0
        ),
        timeout=60,
        message="the delivery worker to run every delivered attempt",
    )
    worker.stop()

    rounds = stack.sql(
        """
        SELECT domain, scanned, redispatched, has_more, extract(epoch FROM finished_at - started_at), started_at,
               finished_at
        FROM dispatch_app_recoveryround WHERE finished_at IS NOT NULL AND domain = ANY(%s) ORDER BY domain, started_at
        """,
        [list(DOMAINS)],
    )
    per_domain = {}
    for domain, scanned, redispatched, has_more, seconds, started, finished in rounds:
        assert scanned <= BATCH, f"{domain}: a round scanned {scanned} > {BATCH}"
        assert redispatched <= CAP, f"{domain}: a round re-dispatched {redispatched} > {CAP}"
        entry = per_domain.setdefault(domain, {"rounds": 0, "redispatched": 0, "longest": 0.0, "first": started})
        entry["rounds"] += 1
        entry["redispatched"] += redispatched
        entry["longest"] = max(entry["longest"], float(seconds))
        entry["last"], entry["last_redispatched"] = started, redispatched
        entry["has_more"] = has_more
    for domain, entry in per_domain.items():
        # Rounds start at least a period apart: rounds 1..R-1 re-dispatched this much between the first and last start.
        span = (entry["last"] - entry["first"]).total_seconds()
        entry["rate_per_s"] = (entry["redispatched"] - entry.pop("last_redispatched")) / span if span else 0.0
        assert entry["redispatched"] >= CAP * (entry["rounds"] - 1), f"{domain}: the herd was not worked: {entry}"
        assert entry["rate_per_s"] <= CAP / PERIOD, f"{domain}: re-dispatch rate over the cap: {entry}"
        assert entry["longest"] < 5, f"{domain}: a round took {entry['longest']:.1f}s"
        assert entry["has_more"], f"{domain}: the herd cannot be over after {entry['rounds']} rounds"

    waits = [
        float(w)
        for (w,) in stack.sql(
            "SELECT extract(epoch FROM dispatched_at - created_at) FROM dispatch_app_dispatchenvelope "
            "WHERE job_id = ANY(%s)",
            [new_ids],
        )
    ]
    waits.sort()
    p50, p95, worst = statistics.median(waits), waits[int(0.95 * (len(waits) - 1))], waits[-1]
    assert p95 < 1.0 and worst < 2.0, f"new jobs waited p50 {p50:.3f}s p95 {p95:.3f}s max {worst:.3f}s"

    report = invariants.check_stack(stack, expected_jobs=stale + len(new_ids), expect_status=None)
    still_waiting = stack.scalar("SELECT count(*) FROM dispatch_app_job WHERE status = 'queued' AND attempt = 1")
    redispatched = sum(e["redispatched"] for e in per_domain.values())
    assert still_waiting == stale - redispatched, "every stale job is either re-dispatched or still a candidate"
    record_figures(
        "11_recovery_herd",
        **report.figures(),
        stale_jobs=stale,
        new_jobs=len(new_ids),
        batch_size=BATCH,
        cap_per_round=CAP,
        period_seconds=PERIOD,
        per_domain={
            d: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in e.items() if k not in ("first", "last")}
            for d, e in per_domain.items()
        },
        new_job_outbox_wait_seconds={"p50": round(p50, 3), "p95": round(p95, 3), "max": round(worst, 3)},
        stale_still_waiting_for_later_rounds=still_waiting,
    )
