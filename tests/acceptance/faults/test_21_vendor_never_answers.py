"""Scenario 21: a vendor that never answers does not hold a job forever (issue 11 item 2).

Two vendor calls end in doubt, the way the chaos runs saw them:

- an image_series worker is killed (-9) while the local provider writes the
  vendor's "succeeded" record (failpoint ``kill_vendor_record_succeeded``,
  after the temp file, before the rename): the record stays whole ("pending"),
  never half-written JSON;
- a partial_edit call outlives ``PROVIDER_TIMEOUT`` (latency 3 s, timeout
  0.3 s): the worker gives up waiting, records the call ``unknown`` and leaves
  the job to recovery (``vendor_call_in_doubt``), its worker alive.

The vendor keeps saying "pending". ``recover --once --dry-run`` first says each
is trusted for now (``VENDOR_EVIDENCE_TRUST_SECONDS`` = 20); once the calls are
older than the bound on the database clock, the dry run says
``outcome_unknown`` with the reason, and a real round finishes them so, with
the reason in each job's history and timeline.
"""

import json
from pathlib import Path

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.gated_vendor import RQWORKER_ARGS
from tests.acceptance.faults.infra import record_figures
from tests.helpers import MANAGE, PYTHON, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(150)]

# Longer than it takes to put both calls in doubt and look (worker start-up, one recover), on a busy CI host.
TRUST = 20
RECOVERY = {
    domain: {"RUNNING_STALE_SECONDS": 0, "VENDOR_EVIDENCE_TRUST_SECONDS": TRUST}
    for domain in ("image_series", "partial_edit")
}


def recover(stack, *args):
    done = stack.manage("recover", "--once", "--json", *args, DISPATCH_RECOVERY=json.dumps(RECOVERY))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {c["job_id"]: c for row in summary["domains"] for c in row["candidates"]}


def test_calls_the_vendor_never_answers_end_outcome_unknown_after_the_trust_bound(private_redis_stack, private_redis):
    stack = private_redis_stack
    dispatcher = stack.dispatcher("--poll-interval", "0.2")
    (killed,) = stack.submit(1, domain="image_series", prefix="s21-killed")
    (timed_out,) = stack.submit(1, domain="partial_edit", prefix="s21-timeout")
    jobs = [killed, timed_out]
    # Both at once, so both calls are recorded within the bound when recovery first looks.
    name = "s21-killed"
    victim = stack.spawn(
        name,
        [PYTHON, MANAGE, "plain_rqworker", "image_series", *RQWORKER_ARGS, "--name", name],
        PRODUCTFLOW_FAILPOINTS="kill_vendor_record_succeeded",
    )
    slow = stack.spawn(
        "worker-vendor-timeout",
        [PYTHON, MANAGE, "plain_rqworker", "partial_edit", *RQWORKER_ARGS],
        DISPATCH_PROVIDER_TIMEOUT=0.3,
        DISPATCH_PROVIDER_LATENCY_MS=3000,
    )
    assert victim.wait(timeout=60) == -9, victim.output()
    # RQ forgets a dead worker when its key expires (a minute or more); that wait is not under test.
    assert private_redis.client().delete(f"rq:worker:{name}") == 1
    wait_until(
        lambda: stack.scalar("SELECT count(*) FROM dispatch_app_jobevent WHERE kind = 'vendor_call_in_doubt'") == 1,
        timeout=60,
        message="the timed-out call left to recovery",
    )
    assert slow.alive(), "the worker gave up waiting on the vendor, and lives on"
    assert stack.count_jobs("running") == 2

    # The kills hit mid-write: every vendor record is still whole JSON, and still "pending".
    records = list(Path(stack.tmp / "media" / "requests").glob("*.json"))
    assert len(records) == 2
    assert {json.loads(path.read_text())["status"] for path in records} == {"pending"}
    calls = dict(stack.sql("SELECT job_id, status FROM dispatch_app_vendorcall"))
    assert calls == {killed: "pending", timed_out: "unknown"}, calls

    trusted = recover(stack, "--dry-run")
    assert {j: trusted[j]["decision"] for j in jobs} == dict.fromkeys(jobs, "leave_alone"), trusted
    for job_id in jobs:
        assert "still pending" in trusted[job_id]["reason"], trusted[job_id]
        assert f"trusted up to {TRUST}s" in trusted[job_id]["reason"], trusted[job_id]
    assert stack.count_jobs("running") == 2

    wait_until(
        lambda: stack.scalar(
            "SELECT bool_and(clock_timestamp() - created_at > make_interval(secs => %s)) FROM dispatch_app_vendorcall",
            [TRUST],
        ),
        timeout=30,
        message="the calls older than the trust bound (database clock)",
    )
    would = recover(stack, "--dry-run")
    assert {j: would[j]["decision"] for j in jobs} == dict.fromkeys(jobs, "outcome_unknown"), would
    assert stack.count_jobs("running") == 2, "a dry run changes nothing"
    done = recover(stack)
    assert {j: done[j]["decision"] for j in jobs} == dict.fromkeys(jobs, "outcome_unknown")

    slow.stop()
    assert dispatcher.stop() == 0, dispatcher.output()
    errors = dict(stack.sql("SELECT id, error FROM dispatch_app_job WHERE id = ANY(%s)", [jobs]))
    for job_id in jobs:
        assert f"past the {TRUST}s trust bound (VENDOR_EVIDENCE_TRUST_SECONDS)" in errors[job_id], errors[job_id]
    from dispatch_app.views.timeline import build

    for job_id in jobs:
        shown = [e for e in build(job_id).entries if e.label == "recovery_outcome_unknown"]
        assert len(shown) == 1 and "trust bound" in shown[0].reason, [(e.label, e.reason) for e in shown]
    report = invariants.check_stack(stack, expected_jobs=2, expect_status={"outcome_unknown": 2})
    record_figures(
        "21_vendor_never_answers",
        **report.figures(),
        calls_in_doubt={"killed_mid_record": 1, "timed_out": 1},
        vendor_records_half_written=0,
        trust_seconds=TRUST,
        reason_example=errors[killed],
    )
