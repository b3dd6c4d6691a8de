"""The Prometheus endpoint, scraped over real HTTP after a known sequence of events."""

from __future__ import annotations

import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatch_app.conf import dispatch_settings
from dispatch_app.dispatch.listener import Listener
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.models import RecoveryRound
from dispatch_app.ops.metrics import DispatchMetrics, serve
from dispatch_app.ops.wiring import FanOut
from dispatch_app.outbox import submit
from dispatch_app.runtime.runner import LoopRunner
from dispatch_app.runtime.wake import Wake
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
