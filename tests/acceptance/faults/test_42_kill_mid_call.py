"""Scenario 42: a worker killed inside a vendor call, once per domain kind (issue 29 items 1 and 2).

Three project workers (``runworkers``), one per domain, each held inside its
job's first vendor call at a gate (``gated_vendor``: the call is in flight, its
ledger record committed "pending"); a fourth, ungated worker serves all three
queues. The dispatcher runs recovery with RUNNING_STALE_SECONDS = 3.

While held, the jobs are stale for recovery, but their workers are only slow:
their PostgreSQL sessions are alive, so recovery leaves them alone. Then the
three are killed (-9) and each job ends as its domain's policy documents
(``RecoveryPolicy.in_doubt``):

- ``workflow`` (retry-safe): attempt 2 makes the step again and succeeds;
- ``image_series`` (not retry-safe, the vendor keeps request records): the
  vendor finished the request meanwhile; recovery asks, the call is settled as
  taken effect, and attempt 2 succeeds without calling the vendor again;
- ``agent`` (not retry-safe, nothing to ask): ``outcome_unknown``, "cannot be asked".

Each is re-run or concluded within RUNNING_STALE_SECONDS + one recovery period
(+ dispatch and start-up margin) of the kill, on the database clock: a killed
worker's session is gone at once, while its RQ hash would say "alive" for a
minute more.
"""

import json
import signal

import pytest
import redis

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import WORKER_ARGS, record_figures
from tests.helpers import PYTHON, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(150)]

STALE = 3
PERIOD = 0.5
# The bound of issue 29 item 2: stale threshold + one recovery period, plus the re-dispatch, the pickup and a
# busy CI host's margin. The heartbeat fallback alone would take 60 s (6 x WORKER_HEARTBEAT_INTERVAL).
BOUND = STALE + PERIOD + 6
DOMAINS = ("workflow", "image_series", "agent")
RECOVERY = {
    domain: {
        "RUNNING_STALE_SECONDS": STALE,
        "PERIOD_SECONDS": PERIOD,
        "JITTER_SECONDS": 0,
        "VENDOR_EVIDENCE_TRUST_SECONDS": 60,
    }
    for domain in DOMAINS
}
PAYLOADS = {
    "workflow": {"workflow_id": "s42", "steps": ["fetch", "tag"]},
    "image_series": {"product_id": "s42", "prompt": "shoe", "count": 1, "size": 8},
    "agent": {"goal": "caption", "max_steps": 1},
}
GATE = {"workflow": "PF_GATE_STEPS", "agent": "PF_GATE_STEPS", "image_series": "PF_GATE_VENDOR"}


def test_a_worker_killed_mid_call_ends_as_its_domain_documents_within_the_bound(shared_stack):
    stack = shared_stack
    env = {"DISPATCH_RECOVERY": json.dumps(RECOVERY), "PRODUCTFLOW_PROVIDER_CALL_LOG": str(stack.tmp / "calls.log")}
    dispatcher = stack.dispatcher("--poll-interval", "0.2", recovery=True, **env)
    jobs, victims, gates = {}, {}, {}
    for domain in DOMAINS:
        gates[domain] = stack.tmp / f"gate-{domain}"
        gates[domain].mkdir()
        victims[domain] = stack.spawn(
            f"victim-{domain}",
            [PYTHON, "-m", "tests.acceptance.faults.gated_vendor", "runworkers", "--queues", domain, *WORKER_ARGS],
            PF_GATE_DIR=gates[domain],
            **{GATE[domain]: "1"},
            **env,
        )
        (jobs[domain],) = stack.submit(1, domain=domain, prefix=f"s42-{domain}", payloads=[PAYLOADS[domain]])
    for domain in DOMAINS:
        wait_until(
            (gates[domain] / "vendor-entered").exists, timeout=60, message=f"the {domain} worker inside its call"
        )
    survivor = stack.worker(*DOMAINS, name="survivor", **env)

    # Slow is not dead: recovery saw each job stale and left it to its live worker.
    def left_alone_after_stale(domain: str) -> bool:
        return bool(
            stack.scalar(
                "SELECT count(*) FROM dispatch_app_jobevent WHERE job_id = %s AND kind = 'recovery_leave_alone' "
                "AND reason LIKE 'running on live worker%%'",
                [jobs[domain]],
            )
        )

    for domain in DOMAINS:
        wait_until(lambda d=domain: left_alone_after_stale(d), timeout=30, message=f"{domain}: a stale round")
    assert (
        stack.sql("SELECT status, attempt FROM dispatch_app_job WHERE id = ANY(%s)", [list(jobs.values())])
        == [("running", 1)] * 3
    ), "a slow worker was taken for dead"

    for proc in victims.values():
        proc.send(signal.SIGKILL)
    for domain, proc in victims.items():
        assert proc.wait(timeout=30) == -9, proc.output()
    killed_at = stack.scalar("SELECT clock_timestamp()")
    # The vendor finished the image request the killed worker had made; recovery will ask it.
    request_id = (gates["image_series"] / "vendor-entered").read_text()
    (stack.tmp / "media" / "requests" / f"{request_id}.json").write_text(json.dumps({"status": "succeeded"}))

    def ended(domain: str, status: str) -> bool:
        stack.check_alive()
        return stack.scalar("SELECT status FROM dispatch_app_job WHERE id = %s", [jobs[domain]]) == status

    wait_until(lambda: ended("workflow", "succeeded"), timeout=60, message="workflow re-run")
    wait_until(lambda: ended("image_series", "succeeded"), timeout=60, message="image_series resumed")
    wait_until(lambda: ended("agent", "outcome_unknown"), timeout=60, message="agent concluded")

    # Their RQ hashes still say "alive" (they expire after 6 silent heartbeat periods): the sessions told.
    hashes = redis.Redis.from_url(stack.redis_url).keys("rq:worker:*")
    for domain, proc in victims.items():
        assert any(f".{proc.pid}.".encode() in key for key in hashes), (domain, hashes)

    # Re-run (attempt 2 started) or concluded (finished), in seconds after the kill, on the database clock.
    seconds = dict(
        stack.sql(
            "SELECT j.domain, extract(epoch FROM COALESCE(a.started_at, j.finished_at) - %s)::float8 "
            "FROM dispatch_app_job j LEFT JOIN dispatch_app_jobattempt a ON a.job_id = j.id AND a.attempt = 2 "
            "WHERE j.id = ANY(%s)",
            [killed_at, list(jobs.values())],
        )
    )
    assert all(0 < s <= BOUND for s in seconds.values()), (seconds, BOUND)
    assert dict(
        stack.sql("SELECT domain, attempt FROM dispatch_app_job WHERE id = ANY(%s)", [list(jobs.values())])
    ) == {
        "workflow": 2,
        "image_series": 2,
        "agent": 1,
    }
    error = stack.scalar("SELECT error FROM dispatch_app_job WHERE id = %s", [jobs["agent"]])
    assert "cannot be asked" in error, error
    calls = (stack.tmp / "calls.log").read_text().split()
    assert "generate_image" not in calls, "the image the vendor made was not made again"
    images = stack.scalar("SELECT result FROM dispatch_app_job WHERE id = %s", [jobs["image_series"]])
    assert images == {"images": [f"vendor request {request_id}"]}, "the vendor's word, not a second image"

    survivor.stop()
    assert dispatcher.stop() == 0, dispatcher.output()
    report = invariants.check_stack(stack, expected_jobs=3, expect_status={"succeeded": 2, "outcome_unknown": 1})
    record_figures(
        "42_kill_mid_call",
        **report.figures(),
        seconds_from_kill_to_rerun_or_conclusion={d: round(s, 2) for d, s in seconds.items()},
        bound_seconds=BOUND,
        running_stale_seconds=STALE,
        recovery_period_seconds=PERIOD,
    )
