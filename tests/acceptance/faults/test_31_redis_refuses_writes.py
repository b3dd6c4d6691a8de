"""Scenarios 31 and 32: Redis refuses every write for a while, under load; then it takes them again.

31. The private Redis at a tiny ``maxmemory`` with ``noeviction`` (RQ's recommended
    policy): every write answers ``OOM``.
32. The private Redis made a replica of a master that is not there (what an old
    master looks like after a failover): every write answers ``READONLY``.

Jobs keep being submitted the whole time. The dispatcher pauses (its breaker:
no claims, one envelope as a probe after a backoff), gives the envelopes back
without counting the attempt, and says so (``productflow_redis_circuit_open`` 1,
and "dispatch paused: Redis refuses writes (...)" as the dispatch loop's
heartbeat error). With MAX_SEND_ATTEMPTS 3, as in the incident where two
minutes of OOM dead-lettered the backlog: nothing dead, no attempt counted, and
every job finishes once after the condition ends.

The condition lasts PF_FAULTS_REFUSAL_SECONDS (default 15 s, CI-sized; the
incident's 120 s for the full run). The CONFIG SET / REPLICAOF go to the private
server only.
"""

import os
import socket
import time
import urllib.request

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.helpers import wait_until

REFUSAL_SECONDS = float(os.environ.get("PF_FAULTS_REFUSAL_SECONDS", "15"))
pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120 + 2 * REFUSAL_SECONDS)]

BEFORE, PER_ROUND, ROUND_SECONDS = 50, 10, 0.5
MAX_SEND_ATTEMPTS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def _heartbeat_error(stack) -> str:
    return stack.scalar("SELECT last_error FROM dispatch_app_loopheartbeat WHERE loop = 'dispatch'") or ""


def _refusal_scenario(stack, private_redis, *, refuse, restore, reason: str, figure: str) -> None:
    redis = private_redis.client()
    port = _free_port()
    dispatcher = stack.dispatcher(
        "--poll-interval",
        "0.2",
        "--metrics-port",
        str(port),
        DISPATCH_MAX_SEND_ATTEMPTS=MAX_SEND_ATTEMPTS,
        DISPATCH_SEND_BACKOFF_BASE=0.2,
        DISPATCH_SEND_TRANSIENT_BACKOFF_MAX=2.0,  # the probe interval's cap
        DISPATCH_HEARTBEAT_INTERVAL=0.2,
    )
    worker = stack.worker("delivery")
    stack.submit(BEFORE, prefix="before")
    stack.wait_all("succeeded", BEFORE, timeout=60)
    # The worker needs Redis writes too (its heartbeats, its dequeue): it waits out the condition stopped,
    # as an operator's workers would be crash-looping; the dispatcher is what is under test.
    worker.stop()

    refuse(redis)
    started = time.monotonic()
    during: list[int] = []
    paused_seen = circuit_seen = False
    while time.monotonic() - started < REFUSAL_SECONDS:
        during += stack.submit(PER_ROUND, prefix="during")
        stack.check_alive()
        paused_seen = paused_seen or _heartbeat_error(stack).startswith(f"dispatch paused: {reason}")
        circuit_seen = circuit_seen or _metric(port, "productflow_redis_circuit_open") == 1
        time.sleep(ROUND_SECONDS)  # the load's pace, not a wait for an effect
    refused_seconds = time.monotonic() - started

    dead = stack.count_envelopes("dead")
    counted = stack.scalar(
        "SELECT max(send_attempts) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND lease_token IS NULL",
        [during],
    )
    marked = stack.scalar(
        "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND status <> 'pending'", [during]
    )
    given_back = stack.scalar(
        "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND last_error LIKE %s",
        [during, f"dispatch paused: {reason}%"],
    )
    pauses = _metric(port, "productflow_dispatch_outage_pauses_total")
    assert dead == 0, f"{dead} envelopes dead-lettered by a server-wide refusal"
    assert counted == 0, f"a server-wide refusal counted {counted} send attempts against an envelope"
    assert marked == 0, "nothing can have been sent"
    assert given_back >= 1, "the dispatcher tried, and gave the envelopes back"
    assert paused_seen, f"the heartbeat never said 'dispatch paused: {reason}': {_heartbeat_error(stack)!r}"
    assert circuit_seen and pauses == 1, f"circuit gauge seen: {circuit_seen}, pauses: {pauses}"

    restore(redis)
    back_at = time.monotonic()
    total = BEFORE + len(during)
    stack.wait_all("dispatched", total, timeout=60, what="envelopes")
    dispatched_after = time.monotonic() - back_at
    wait_until(lambda: _metric(port, "productflow_redis_circuit_open") == 0, timeout=10, message="the circuit closed")
    wait_until(
        lambda: _heartbeat_error(stack).startswith("dispatch resumed"), timeout=10, message="the heartbeat's resume"
    )
    worker = stack.worker("delivery", name="worker-after")
    stack.wait_all("succeeded", total, timeout=120)
    finished_after = time.monotonic() - back_at
    assert dispatcher.stop() == 0, dispatcher.output()
    worker.stop()

    assert stack.count_envelopes("dead") == 0
    attempts = dict(stack.sql("SELECT send_attempts, count(*) FROM dispatch_app_dispatchenvelope GROUP BY 1"))
    assert attempts == {1: total}, f"every envelope sent at its first counted attempt: {attempts}"
    report = invariants.check_stack(stack, expected_jobs=total)
    record_figures(
        figure,
        **report.figures(),
        refused_seconds=round(refused_seconds, 1),
        jobs_submitted_while_refused=len(during),
        envelopes_given_back_uncounted=given_back,
        dead=0,
        pauses=int(pauses),
        all_dispatched_after_condition_seconds=round(dispatched_after, 2),
        all_finished_after_condition_seconds=round(finished_after, 2),
    )


def test_redis_out_of_memory_pauses_dispatch_and_dead_letters_nothing(private_redis_stack, private_redis):
    def refuse(redis):
        redis.config_set("maxmemory-policy", "noeviction")
        redis.config_set("maxmemory", 1)  # bytes: over the limit at once

    def restore(redis):
        redis.config_set("maxmemory", 0)

    _refusal_scenario(
        private_redis_stack,
        private_redis,
        refuse=refuse,
        restore=restore,
        reason="Redis refuses writes (OOM",
        figure="31_redis_out_of_memory",
    )


def test_redis_turned_read_only_replica_pauses_dispatch_and_dead_letters_nothing(private_redis_stack, private_redis):
    def refuse(redis):
        redis.replicaof("127.0.0.1", 9)  # a master that is not there: the data stays, writes are refused

    def restore(redis):
        redis.replicaof("NO", "ONE")

    _refusal_scenario(
        private_redis_stack,
        private_redis,
        refuse=refuse,
        restore=restore,
        reason="Redis refuses writes (read-only replica)",
        figure="32_redis_read_only",
    )
