"""Scenario 43: workers killed mid-step in every domain kind, under load (issue 29 item 4).

Four project workers serve all five domains while jobs keep coming (a vendor
latency of 250 ms per call, so a worker is inside a vendor call most of the
time). Round by round, a worker that is inside a vendor call of the round's
domain (its attempt's ledger call still "pending"; delivery: running its
delivery) is killed with -9 and replaced. Every domain kind is hit:
retry-safe (workflow, delivery), not retry-safe with an askable vendor
(image_series, partial_edit), not retry-safe without (agent).

Checked, besides the invariants (0 lost, at most one execution per attempt,
no non-retry-safe vendor call taking effect twice):

- no retry-safe job ends outcome_unknown (they all succeed);
- every attempt a kill interrupted is followed, within RUNNING_STALE_SECONDS +
  one recovery period + margin of the kill (database clock), by its
  successor's start or by its job's conclusion. The killed workers' RQ hashes
  still say "alive" for 60 s: the bound holds only because their PostgreSQL
  sessions say "dead" at once (dispatch_app.db.liveness).

VENDOR_EVIDENCE_TRUST_SECONDS is below the stale threshold: an askable call the
vendor still calls "pending" (its worker died mid-call, so it stays pending) is
past the trust bound when recovery first looks, and concluded at once.
"""

import json
import signal
import time

import pytest

from dispatch_app.config.tuning import RECOVERY_SPREAD_SHARE
from tests.acceptance.faults import invariants, vendor_ledger
from tests.acceptance.faults.infra import record_figures
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]

DOMAINS = ("workflow", "delivery", "image_series", "partial_edit", "agent")
RETRY_SAFE = ("workflow", "delivery")
STALE = 3
PERIOD = 0.5
# Issue 29 item 2's bound: the stale threshold, one recovery period, the round's spread (its re-dispatches fall due
# over RECOVERY_SPREAD_SHARE of the period), then the dispatch and a start (margin for a busy 2-core CI host: 6 s
# was passed by 0.35 s on a host 1.7x slower than the one it was set on, 5 Dec 2026). RQ's heartbeat expiry alone
# would be 60 s.
BOUND = STALE + PERIOD + RECOVERY_SPREAD_SHARE * PERIOD + 8
RECOVERY = {
    domain: {
        "RUNNING_STALE_SECONDS": STALE,
        "QUEUED_STALE_SECONDS": 4,
        "VENDOR_EVIDENCE_TRUST_SECONDS": 2,
        "MAX_ATTEMPTS": 20,
        "PERIOD_SECONDS": PERIOD,
        "JITTER_SECONDS": 0,
    }
    for domain in DOMAINS
}
PAYLOADS = {
    "image_series": lambda i: {"product_id": f"p-{i}", "prompt": "shoe", "count": 3, "size": 8},
    "partial_edit": lambda i: {"image": f"img-{i}.png", "region": [0, 0, 8, 8], "instruction": "brighter"},
    "agent": lambda i: {"goal": f"caption {i}", "max_steps": 3},
    "workflow": lambda i: {"workflow_id": f"wf-{i}", "steps": ["fetch", "resize", "tag"]},
    "delivery": lambda i: {"asset": f"a-{i}", "target": f"https://target.example.invalid/{i}"},
}
WORKERS = 4
ROUNDS = 2  # kill rounds per domain
PER_WAVE = 3  # jobs per domain submitted before each kill round
ACTIVE = "SELECT count(*) FROM dispatch_app_job WHERE status IN ('submitted', 'queued', 'running')"

# The workers inside a vendor call of this domain now: their attempt's ledger call is still pending.
MID_STEP = """
SELECT DISTINCT a.worker FROM dispatch_app_jobattempt a
JOIN dispatch_app_job j ON j.id = a.job_id AND j.attempt = a.attempt
WHERE j.status = 'running' AND j.domain = %(domain)s AND a.worker <> ''
  AND (j.domain = 'delivery' OR EXISTS (
      SELECT 1 FROM dispatch_app_vendorcall v WHERE v.job_id = j.id AND v.attempt = j.attempt AND v.status = 'pending'))
"""

# The attempts a kill interrupted (started by the worker, not finished before the kill), and how long after the kill
# their successor started or their job was concluded. The worker name is pf.<host>.<pid>.<suffix>.
INTERRUPTED = """
SELECT a.job_id, a.attempt, j.domain,
       extract(epoch FROM LEAST(n.started_at, CASE WHEN j.attempt = a.attempt THEN j.finished_at END) - %(at)s)::float8
FROM dispatch_app_jobattempt a
JOIN dispatch_app_job j ON j.id = a.job_id
LEFT JOIN dispatch_app_jobattempt n ON n.job_id = a.job_id AND n.attempt = a.attempt + 1
WHERE a.worker LIKE %(name)s AND a.started_at < %(at)s AND (a.finished_at IS NULL OR a.finished_at >= %(at)s)
"""


def test_workers_killed_mid_step_lose_nothing_and_their_work_moves_on_within_the_bound(shared_stack):
    stack = shared_stack
    call_log = stack.tmp / "vendor-calls.log"
    env = {
        "DISPATCH_PROVIDER_LATENCY_MS": 250,
        "DISPATCH_RECOVERY": json.dumps(RECOVERY),
        "DISPATCH_SEND_BACKOFF_BASE": 0.1,
        # One job in a worker's hand at a time: a kill interrupts the job it runs, not a queue of taken ones.
        "DISPATCH_WORKER_PREFETCH": 1,
        "PRODUCTFLOW_PROVIDER_CALL_LOG": call_log,
    }
    dispatcher = stack.dispatcher("--poll-interval", "0.5", recovery=True, **env)
    workers = [stack.worker(*DOMAINS, name=f"worker{slot}", **env) for slot in range(WORKERS)]
    jobs: list[int] = []
    kills: list[tuple[str, int, object]] = []  # (domain, pid, kill time on the database clock)
    index = 0
    for domain in DOMAINS * ROUNDS:
        for each in DOMAINS:
            jobs += stack.submit(PER_WAVE, domain=each, payloads=[PAYLOADS[each](index + i) for i in range(PER_WAVE)])
        index += PER_WAVE
        victim = None

        def mid_step() -> bool:
            nonlocal victim
            stack.check_alive()
            pids = {name.rsplit(".", 2)[-2] for (name,) in stack.sql(MID_STEP, {"domain": domain})}
            slots = [slot for slot, proc in enumerate(workers) if str(proc.pid) in pids]
            victim = slots[0] if slots else None
            return victim is not None

        wait_until(mid_step, timeout=60, interval=0.02, message=f"a worker inside a {domain} vendor call")
        proc = workers[victim]
        proc.send(signal.SIGKILL)
        assert proc.wait(timeout=10) == -9
        kills.append((domain, proc.pid, stack.scalar("SELECT clock_timestamp()")))
        workers[victim] = stack.worker(*DOMAINS, name=f"worker{victim}", **env)

    started = time.monotonic()
    wait_until(
        lambda: stack.check_alive() or stack.scalar(ACTIVE) == 0,
        timeout=90,
        interval=0.2,
        message="every job terminal",
    )
    drained_seconds = time.monotonic() - started
    for proc in workers:
        proc.stop()
    assert dispatcher.stop() == 0, dispatcher.output()[-4000:]

    report = invariants.check_stack(stack, expected_jobs=len(jobs), expect_status=None)
    vendor_ledger.check(stack, call_log)
    vendor_ledger.bounded_unknowns(stack)
    by_domain = dict(
        stack.sql("SELECT domain, array_agg(DISTINCT status ORDER BY status) FROM dispatch_app_job GROUP BY domain", [])
    )
    for domain in RETRY_SAFE:
        assert by_domain[domain] == ["succeeded"], (domain, by_domain[domain])

    interrupted = []
    for domain, pid, at in kills:
        rows = stack.sql(INTERRUPTED, {"name": f"%.{pid}.%", "at": at})
        assert rows, f"the {domain} kill of worker {pid} interrupted no attempt"
        interrupted += rows
    late = [row for row in interrupted if row[3] is None or not 0 < row[3] <= BOUND]
    assert not late, f"interrupted attempts whose successor or conclusion came later than {BOUND}s: {late}"
    assert {domain for domain, _pid, _at in kills} == set(DOMAINS)
    record_figures(
        "43_kill_workers_mid_step",
        **report.figures(),
        kills={domain: sum(1 for d, _p, _a in kills if d == domain) for domain in DOMAINS},
        interrupted_attempts=len(interrupted),
        successor_or_conclusion_seconds_max=round(max(row[3] for row in interrupted), 2),
        bound_seconds=BOUND,
        retry_safe_outcome_unknown=0,
        statuses_by_domain=by_domain,
        drain_after_last_kill_seconds=round(drained_seconds, 1),
    )
