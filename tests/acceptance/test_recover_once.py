"""``manage.py recover --once`` as operators run it: a real process against the test database and Redis."""

from __future__ import annotations

import json
import signal
import subprocess
import threading

import pytest
from django.db import connections

from dispatch_app import submit
from dispatch_app.domains import domain_keys
from dispatch_app.models import DispatchEnvelope, Job, RecoveryRound
from dispatch_app.recovery.round import Round, RoundSignals
from dispatch_app.rq.publish import rq_job_id
from dispatch_app.store import vendor_calls
from tests.factories import PAYLOADS
from tests.helpers import MANAGE, PYTHON, wait_until
from tests.integration.recovery_helpers import dispatch_now, policy, snapshot, statuses, zero_thresholds

# The shipped domains, in registry order (the task queue's domain has no demo payload).
SHIPPED = list(PAYLOADS)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]
SAFETY = 60


def recover(env, *args, extra_env=None):
    env = {**env, "DISPATCH_RECOVERY": json.dumps(zero_thresholds()), **(extra_env or {})}
    return subprocess.run(
        [PYTHON, MANAGE, "recover", *args], env=env, capture_output=True, text=True, timeout=SAFETY, check=False
    )


def by_domain(proc) -> dict:
    return {row["domain"]: row for row in json.loads(proc.stdout)["domains"]}


@pytest.fixture
def lost_jobs(redis_conn):
    """One job per domain, dispatched, then lost with Redis."""
    jobs = [submit(domain, PAYLOADS[domain]) for domain in SHIPPED]
    dispatch_now()
    redis_conn.flushdb()
    return jobs


@pytest.mark.parametrize(
    ("args", "extra_env", "message"),
    [
        (["--once", "--domain", "delivry"], None, "valid domains: workflow, image_series, delivery, partial_edit"),
        (["--domain", "delivery"], None, "the following arguments are required: --once"),
        (["--once"], {"DISPATCH_RECOVERY": '{"agent": {"BATCH_SIZE": 0}}'}, "['agent']['BATCH_SIZE'] must be >= 1"),
    ],
    ids=["unknown-domain", "no-once", "bad-setting"],
)
def test_bad_arguments_exit_2_with_a_clear_message(subprocess_env, args, extra_env, message):
    proc = recover(subprocess_env, *args, extra_env=extra_env)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def test_recovery_runs_before_the_dispatch_drain(subprocess_env, redis_conn, lost_jobs):
    proc = recover(subprocess_env, "--once", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    # One lost job per shipped domain; every declared domain (the task queue's too) gets its round.
    rows = {row["domain"]: row for row in summary["domains"]}
    assert set(rows) == set(domain_keys())
    assert all(row["status"] == "ok" and row["redispatched"] == (row["domain"] in SHIPPED) for row in rows.values())
    # What recovery re-dispatched was sent by the drain that followed it in the same run.
    assert summary["dispatch"]["dispatched"] == len(SHIPPED)
    assert statuses(lost_jobs) == {job.pk: ("queued", 2) for job in lost_jobs}
    assert set(DispatchEnvelope.objects.filter(attempt=2).values_list("status", flat=True)) == {"dispatched"}
    assert all(redis_conn.exists(f"rq:job:{rq_job_id(job.pk, 2)}") for job in lost_jobs)
    assert RecoveryRound.objects.filter(finished_at__isnull=False).count() == len(domain_keys())


def test_a_failing_domain_does_not_stop_the_others(subprocess_env, lost_jobs):
    proc = recover(subprocess_env, "--once", "--json", extra_env={"PRODUCTFLOW_FAILPOINTS": "recovery_round_agent"})
    assert proc.returncode == 1, proc.stderr
    rows = by_domain(proc)
    assert rows["agent"]["status"] == "failed" and "failpoint recovery_round_agent" in rows["agent"]["error"]
    assert all(rows[d]["status"] == "ok" and rows[d]["redispatched"] == 1 for d in SHIPPED if d != "agent")
    assert json.loads(proc.stdout)["dispatch"]["dispatched"] == len(SHIPPED) - 1
    expected = {job.pk: ("queued", 1) if job.domain == "agent" else ("queued", 2) for job in lost_jobs}
    assert statuses(lost_jobs) == expected
    assert "recovery failed for: agent" in proc.stderr


def test_table_output_names_every_domain(subprocess_env, lost_jobs):
    proc = recover(subprocess_env, "--once", "--domain", "delivery", "--domain", "agent")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["domain", "status", "scanned"]
    assert [line.split()[:4] for line in lines[1:3]] == [["delivery", "ok", "1", "1"], ["agent", "ok", "1", "1"]]
    assert "dispatch drain: claimed 2, dispatched 2" in proc.stdout


def test_dry_run_prints_decisions_and_leaves_every_row_as_it_was(subprocess_env, redis_conn, lost_jobs):
    running = Job.objects.get(pk=lost_jobs[SHIPPED.index("agent")].pk)
    Job.objects.filter(pk=running.pk).update(status="running")
    # It died inside a tool call: recorded in the vendor-call ledger, and agent tools cannot be asked.
    vendor_calls.record(running.pk, running.attempt, 0, "agent-step-0", "local-agent-step")
    before, redis_before = snapshot(), sorted(redis_conn.keys("*"))

    proc = recover(subprocess_env, "--once", "--dry-run")

    assert proc.returncode == 0, proc.stderr
    assert snapshot() == before
    assert sorted(redis_conn.keys("*")) == redis_before
    lines = {line.split()[0] + ":" + line.split()[2]: line for line in proc.stdout.splitlines() if " job " in line}
    delivery = lines[f"delivery:{lost_jobs[SHIPPED.index('delivery')].pk}"]
    assert "redispatch" in delivery and "RQ job is missing" in delivery
    agent = lines[f"agent:{running.pk}"]
    assert "outcome_unknown" in agent and "agent-step-0" in agent and "cannot be asked" in agent
    assert "dispatch drain" not in proc.stdout


def test_two_processes_never_run_a_round_of_the_same_domain_at_once(subprocess_env, lost_jobs):
    held, release, outcome = threading.Event(), threading.Event(), {}

    def hold(found):
        held.set()
        release.wait(SAFETY)

    def holder():
        try:
            signals = RoundSignals(after_discovery=hold)
            outcome["round"] = Round(policy("delivery"), signals=signals).run_once()
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(SAFETY)
        proc = recover(subprocess_env, "--once", "--json", "--domain", "delivery", "--domain", "workflow")
    finally:
        release.set()
        thread.join(SAFETY)
    assert proc.returncode == 3, proc.stderr  # busy is not success: delivery was not recovered by this command
    assert "another process holds the round lock: delivery" in proc.stderr
    rows = by_domain(proc)
    assert rows["delivery"]["status"] == "busy" and rows["delivery"]["scanned"] == 0
    assert rows["workflow"]["status"] == "ok" and rows["workflow"]["redispatched"] == 1
    # The held round (this process) did the delivery job, once, after the child's drain had run.
    assert outcome["round"].redispatched == 1
    delivery = lost_jobs[SHIPPED.index("delivery")]
    assert statuses([delivery]) == {delivery.pk: ("submitted", 2)}
    assert DispatchEnvelope.objects.filter(job=delivery).count() == 2


def test_rundispatcher_runs_the_recovery_loops(subprocess_env, redis_conn, lost_jobs):
    env = {**subprocess_env, "DISPATCH_RECOVERY": json.dumps(zero_thresholds(PERIOD_SECONDS=0.2))}
    proc = subprocess.Popen(
        [PYTHON, MANAGE, "rundispatcher", "--domains", "delivery,agent"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        delivery = lost_jobs[SHIPPED.index("delivery")]
        wait_until(lambda: statuses([delivery])[delivery.pk] == ("queued", 2), SAFETY, message="recovered and sent")
        assert redis_conn.exists(f"rq:job:{rq_job_id(delivery.pk, 2)}")
        assert set(RecoveryRound.objects.values_list("domain", flat=True)) == {"delivery", "agent"}
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=SAFETY)
    assert proc.returncode == 0, output
    assert "recovery-delivery" in output and "recovery-agent" in output
    workflow = lost_jobs[SHIPPED.index("workflow")]
    assert statuses([workflow]) == {workflow.pk: ("queued", 1)}  # not one of this process's domains
