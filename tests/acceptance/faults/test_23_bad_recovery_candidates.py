"""Scenario 23: candidates whose handling raises do not stall their domain's recovery (issue 11 item 6).

30 delivery jobs are dispatched while no worker runs. The RQ job hashes of
the 26 oldest are then corrupted in Redis (``created_at`` unparseable: reading
them raises ``ValueError``), and those of the 4 newest are lost. ``recover
--once`` (batch 25) runs three times:

1. the 25 oldest raise: each is counted (``errors``), recorded in its history
   (``recovery_error``) and backed off to the back of ``ORDER BY updated_at, id``;
2. the 26th still raises, and the 27th..30th, behind it, are re-dispatched;
3. after the corrupt hashes are removed (as their TTL would), the 26 are
   re-dispatched too (batch 50).

A worker then runs all 30 once. Before the back-off, the 25 oldest took every
slot of every round and the 27th was never looked at.
"""

import json

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(150)]

RECOVERY = {"delivery": {"QUEUED_STALE_SECONDS": 0, "BATCH_SIZE": 25}}


def recover(stack, batch=25):
    overrides = {"delivery": {**RECOVERY["delivery"], "BATCH_SIZE": batch}}
    done = stack.manage("recover", "--once", "--json", DISPATCH_RECOVERY=json.dumps(overrides))
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    (row,) = [r for r in summary["domains"] if r["domain"] == "delivery"]
    return done.returncode, row


def test_one_bad_candidate_does_not_stall_the_domain(private_redis_stack, private_redis):
    stack = private_redis_stack
    dispatcher = stack.dispatcher("--poll-interval", "0.2")
    jobs = stack.submit(30, prefix="s23")
    stack.wait_all("dispatched", 30, timeout=60, what="envelopes")
    assert dispatcher.stop() == 0, dispatcher.output()
    redis = private_redis.client()
    poisoned, lost = jobs[:26], jobs[26:]
    for job_id in poisoned:
        assert redis.hset(f"rq:job:{stack.rq_job_id(job_id, 1)}", "created_at", "not a date") == 0
    for job_id in lost:
        assert redis.delete(f"rq:job:{stack.rq_job_id(job_id, 1)}") == 1

    code1, first = recover(stack)
    assert code1 != 0, "a round with errors does not exit as if all was well"
    assert (first["scanned"], first["errors"], first["redispatched"]) == (25, 25, 0), first
    assert [c["job_id"] for c in first["candidates"]] == poisoned[:25]
    assert all(c["outcome"] == "error" and "ValueError" in c["reason"] for c in first["candidates"])

    code2, second = recover(stack)
    assert code2 != 0
    handled = {c["job_id"]: c["outcome"] for c in second["candidates"]}
    assert [c["job_id"] for c in second["candidates"][:5]] == [poisoned[25], *lost], second["candidates"][:5]
    assert {job: handled[job] for job in lost} == dict.fromkeys(lost, "done")
    assert second["redispatched"] == 4 and second["errors"] == 21, second

    for job_id in poisoned:  # the corrupt hashes go, as their TTL would take them
        redis.delete(f"rq:job:{stack.rq_job_id(job_id, 1)}")
    code3, third = recover(stack, batch=50)  # all 30 in one round: the 4 already re-sent are left alone
    assert code3 == 0, third
    assert (third["scanned"], third["redispatched"], third["left_alone"], third["errors"]) == (30, 26, 4, 0), third

    worker = stack.worker("delivery")
    stack.wait_all("succeeded", 30, timeout=60)
    worker.stop()
    rounds = stack.sql(
        "SELECT scanned, errors, redispatched FROM dispatch_app_recoveryround WHERE domain = 'delivery' ORDER BY id"
    )
    assert rounds == [(25, 25, 0), (25, 21, 4), (30, 0, 26)], rounds
    errors = stack.scalar("SELECT count(*) FROM dispatch_app_jobevent WHERE kind = 'recovery_error'")
    assert errors == 46
    report = invariants.check_stack(stack, expected_jobs=30)
    record_figures(
        "23_bad_recovery_candidates",
        **report.figures(),
        raising_candidates=26,
        rounds=[dict(zip(("scanned", "errors", "redispatched"), r, strict=True)) for r in rounds],
        recovery_error_events=errors,
        the_27th_handled_in_round=2,
    )
