"""The Prometheus endpoint, scraped over real HTTP after a known sequence of events."""

from __future__ import annotations

import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.dispatch.listener import Listener
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.wake import Wake
from dispatch_app.housekeeping.metrics import DispatchMetrics, serve
from dispatch_app.housekeeping.wiring import FanOut
from dispatch_app.models import RecoveryRound
from dispatch_app.outbox.submit import submit
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.runtime.runner import LoopRunner
from tests.factories import PAYLOADS
from tests.integration.opsdata import envelope, job

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(port: int) -> dict[tuple, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


class FailsOnce:
    name = "flaky"

    def __init__(self, stop):
        self.stop = stop

    def wait(self):
        return "tick"

    def run_once(self, trigger):
        self.stop.set()
        raise RuntimeError("boom")


class StopOnReconnect:
    def __init__(self, stop):
        self.stop = stop

    def listener_reconnect(self):
        self.stop.set()


def test_each_metric_has_the_right_value_after_a_known_sequence(redis_conn):
    conf = dispatch_settings()
    metrics = DispatchMetrics()
    server, close = serve(metrics.registry, 0)
    port = server.server_address[1]
    loop = DispatchLoop(conf, observer=metrics)
    try:
        # 1. Two jobs announced by NOTIFY: a notify scan, nothing missed.
        submit("delivery", PAYLOADS["delivery"])
        submit("workflow", PAYLOADS["workflow"])
        assert loop.run_once("notify").dispatched == 2
        # 2. One job nobody announced, found by the fallback tick: a missed wake-up.
        submit("agent", PAYLOADS["agent"])
        assert loop.run_once("tick").unannounced == 1
        # 3. An envelope of a retired domain: a permanent failure, dead at once.
        envelope(job("retired"), "pending", created_ago=1)
        assert loop.run_once("catch_up").dead == 1
        # 4. A loop that fails once, through the real loop runner.
        stop = threading.Event()
        runner = LoopRunner(FailsOnce(stop), stop, on_error=metrics.loop_error, on_success=lambda n, r: None)
        runner.start()
        assert runner.join(10)
        # 5. The listener loses (never gets) its connection once.
        stop = threading.Event()
        bad = {"host": "/nonexistent-socket-dir", "dbname": "x", "user": "x", "connect_timeout": 1}
        Listener(conf, Wake(), stop, conninfo=bad, observer=FanOut(metrics, StopOnReconnect(stop))).run()
        # 6. Gauges and decisions read from the database at scrape time.
        envelope(job("image_series", "submitted", updated_ago=700, submitted_ago=700), "pending", created_ago=600)
        RecoveryRound.objects.create(domain="delivery", scanned=5, redispatched=2, left_alone=2, unknown=1)
        RecoveryRound.objects.create(domain="delivery", scanned=1, redispatched=1)  # unfinished: not yet counted
        RecoveryRound.objects.filter(scanned=5).update(finished_at="2030-01-01T00:00:00Z")

        m = scrape(port)
    finally:
        loop.close()
        close()

    def value(name, **labels):
        return m[(name, tuple(sorted(labels.items())))]

    assert value("productflow_envelopes_dispatched_total") == 3
    assert value("productflow_envelope_send_failures_total") == 1
    assert value("productflow_envelopes_dead_total") == 1
    assert value("productflow_dispatch_scans_total", trigger="notify") == 1
    assert value("productflow_dispatch_scans_total", trigger="tick") == 1
    assert value("productflow_dispatch_scans_total", trigger="catch_up") == 1
    assert value("productflow_missed_wakeups_total") == 1
    assert value("productflow_dispatch_latency_seconds_count") == 3
    assert 0 < value("productflow_dispatch_latency_seconds_sum") < 30
    assert value("productflow_db_connection_wait_seconds_count") == 3
    assert value("productflow_claim_lock_wait_seconds_count") == 3
    assert value("productflow_claim_lock_wait_seconds_sum") > 0
    assert value("productflow_loop_errors_total", loop="flaky") == 1
    assert value("productflow_listener_reconnects_total") == 1
    assert value("productflow_oldest_pending_envelope_age_seconds", domain="image_series") == pytest.approx(600, abs=5)
    assert value("productflow_oldest_pending_envelope_age_seconds", domain="delivery") == 0
    assert value("productflow_oldest_candidate_age_seconds", domain="image_series") == pytest.approx(700, abs=5)
    assert value("productflow_jobs", domain="image_series", status="submitted") == 1
    assert value("productflow_envelopes", domain="image_series", status="pending") == 1
    assert value("productflow_envelopes", domain="retired", status="dead") == 1  # no longer registered: still counted
    assert value("productflow_recovery_decisions_total", domain="delivery", kind="redispatched") == 2
    assert value("productflow_recovery_decisions_total", domain="delivery", kind="unknown") == 1
    assert value("productflow_recovery_decisions_total", domain="delivery", kind="left_alone") == 2
    assert value("productflow_recovery_decisions_total", domain="workflow", kind="redispatched") == 0
    assert value("productflow_stats_up") == 1
    assert ("productflow_notification_queue_usage", ()) in m


def test_rundispatcher_assembly_serves_metrics_on_localhost_only():
    from dispatch_app.runtime import assembly

    conf = dispatch_settings()
    supervisor = assembly.build(conf, {"metrics_port": 0, "no_listen": True, "no_recovery": True})
    try:
        host, port = supervisor.ops.metrics_server.server_address[:2]
        assert host == "127.0.0.1"
        m = scrape(port)
        assert m[("productflow_loop_errors_total", (("loop", "dispatch"),))] == 0
        assert ("productflow_missed_wakeups_total", ()) in m
        assert {"dispatch", "heartbeat", "retention"} <= set(supervisor.loop_names())
    finally:
        supervisor.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_outcomes_rq_waits_rq_side_and_pauses_are_exported(redis_conn):
    """Issue 12's metrics through a real registry: attempts ending after the collector started are counted once."""
    from prometheus_client import CollectorRegistry
    from rq import Queue
    from rq.serializers import JSONSerializer

    from dispatch_app.actions import operator as actions
    from dispatch_app.housekeeping.metrics import OperatorCollector
    from dispatch_app.models import JobAttempt
    from tests.integration.opsdata import ago, sql

    registry = CollectorRegistry()
    collector = OperatorCollector(lag_seconds=0)
    registry.register(collector)

    def ended(domain, outcome, *, dispatched_ago, started_ago):
        j = job(domain, "queued")
        a = JobAttempt.objects.create(job=j, attempt=1, domain=domain)
        sets = [f"finished_at = {ago(0)}", f"outcome = '{outcome}'"]
        if dispatched_ago is not None:
            sets.append(f"dispatched_at = {ago(dispatched_ago)}")
        if started_ago is not None:
            sets.append(f"started_at = {ago(started_ago)}")
        sql(f"UPDATE dispatch_app_jobattempt SET {', '.join(sets)} WHERE id = %s", [a.pk])

    ended("image_series", "failed", dispatched_ago=10, started_ago=9.98)  # 20 ms in RQ
    ended("image_series", "succeeded", dispatched_ago=100, started_ago=45)  # 55 s in RQ
    ended("image_series", "superseded", dispatched_ago=5, started_ago=4.7)  # a retried attempt: a wait, no outcome
    ended("agent", "outcome_unknown", dispatched_ago=None, started_ago=None)  # never started: no wait
    actions.pause_domain("delivery")
    queue = Queue("workflow", connection=redis_conn, serializer=JSONSerializer)
    for i in (1, 2):
        queue.enqueue("dispatch_app.execution.execute", "workflow", i, 1, job_id=rq_job_id(900 + i, 1))

    def scrape():
        out = {}
        for family in registry.collect():
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    m = scrape()
    assert m[("productflow_job_outcomes_total", (("domain", "image_series"), ("outcome", "failed")))] == 1
    assert m[("productflow_job_outcomes_total", (("domain", "image_series"), ("outcome", "succeeded")))] == 1
    assert m[("productflow_job_outcomes_total", (("domain", "agent"), ("outcome", "outcome_unknown")))] == 1
    assert m[("productflow_job_outcomes_total", (("domain", "delivery"), ("outcome", "failed")))] == 0
    wait = {k[1]: v for k, v in m.items() if k[0].startswith("productflow_rq_queue_wait_seconds")}
    assert m[("productflow_rq_queue_wait_seconds_count", (("domain", "image_series"),))] == 3, wait
    assert m[("productflow_rq_queue_wait_seconds_bucket", (("domain", "image_series"), ("le", "0.025")))] == 1
    assert m[("productflow_rq_queue_wait_seconds_bucket", (("domain", "image_series"), ("le", "0.5")))] == 2
    assert m[("productflow_rq_queue_wait_seconds_bucket", (("domain", "image_series"), ("le", "30.0")))] == 2
    assert m[("productflow_rq_queue_wait_seconds_bucket", (("domain", "image_series"), ("le", "60.0")))] == 3
    assert m[("productflow_rq_queue_wait_seconds_sum", (("domain", "image_series"),))] == pytest.approx(55.32, abs=0.05)
    assert m[("productflow_rq_queue_wait_seconds_count", (("domain", "agent"),))] == 0, wait
    assert m[("productflow_domain_paused", (("domain", "delivery"),))] == 1
    assert m[("productflow_domain_paused", (("domain", "workflow"),))] == 0
    new_lane = (("lane", "new"), ("queue", "workflow"))
    late_lane = (("lane", "recovery"), ("queue", "workflow.recovery"))
    assert m[("productflow_rq_queue_depth", new_lane)] == 2
    assert m[("productflow_rq_queue_depth", late_lane)] == 0
    assert m[("productflow_rq_live_workers", new_lane)] == 0
    assert m[("productflow_rq_oldest_job_age_seconds", new_lane)] == 0  # never dispatched by us
    assert m[("productflow_rq_up", ())] == 1

    # A second scrape counts nothing twice.
    m = scrape()
    assert m[("productflow_job_outcomes_total", (("domain", "image_series"), ("outcome", "failed")))] == 1
    assert m[("productflow_rq_queue_wait_seconds_count", (("domain", "image_series"),))] == 3, wait
