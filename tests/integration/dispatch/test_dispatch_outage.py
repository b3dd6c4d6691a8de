"""Redis refusing writes pauses dispatch; it never counts against the envelopes (private redis-server, real PG).

The loop runs on an injected clock: the breaker's backoff passes without
sleeping. The envelopes' own give-back delay is database time, so the test moves
their ``available_at`` into the past where the clock would have.
"""

import pytest

from dispatch_app import submit_many
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.wake import NOTIFY
from dispatch_app.housekeeping.heartbeat import HeartbeatTracker
from dispatch_app.housekeeping.metrics import DispatchMetrics
from dispatch_app.housekeeping.wiring import FanOut
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.rq.publish import Publisher
from dispatch_app.store.claim import Claimed
from tests.factories import PAYLOADS
from tests.integration.loop_kit import DrainLog, loop_settings
from tests.private_servers import PrivateRedis, make_base_dir, remove_tree

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def private_redis():
    base = make_base_dir("pf-outage-")
    server = PrivateRedis(base)
    server.start()
    yield server
    server.stop()
    remove_tree(base)


def _due_now() -> None:
    DispatchEnvelope.objects.filter(status="pending").update(available_at="2000-01-01T00:00:00Z")


def _gauge(metrics: DispatchMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def test_oom_pauses_dispatch_gives_envelopes_back_uncounted_and_a_probe_resumes_it(private_redis):
    conf = loop_settings(
        BATCH_SIZE=5, SEND_CHUNK_SIZE=5, MAX_SEND_ATTEMPTS=1, SEND_BACKOFF_BASE=1.0, SEND_TRANSIENT_BACKOFF_MAX=4.0
    )
    redis = private_redis.client()
    redis.config_set("maxmemory-policy", "noeviction")
    redis.config_set("maxmemory", 1)  # the private server only: over its limit at once
    jobs = submit_many([("delivery", PAYLOADS["delivery"])] * 7)
    clock, log, tracker = Clock(), DrainLog(), HeartbeatTracker(clock=lambda: 0.0)
    metrics = DispatchMetrics(database=False)
    loop = DispatchLoop(conf, publisher=Publisher(conf, redis), observer=FanOut(log, tracker, metrics), clock=clock)
    try:
        first = loop.run_once()
        assert (first.claimed, first.outage_released, first.dead, first.failed) == (5, 5, 0, 0)
        assert "OOM" in first.outage
        assert loop.breaker.state == "open"
        # MAX_SEND_ATTEMPTS is 1: had the outage counted, all five would be dead now.
        envelopes = list(DispatchEnvelope.objects.order_by("id"))
        assert {(e.status, e.send_attempts, e.lease_token) for e in envelopes} == {("pending", 0, None)}
        assert all(e.last_error.startswith("dispatch paused: Redis refuses writes (OOM") for e in envelopes[:5])
        assert _gauge(metrics, "productflow_redis_circuit_open") == 1
        assert _gauge(metrics, "productflow_dispatch_outage_pauses_total") == 1
        assert _gauge(metrics, "productflow_envelopes_outage_released_total") == 5
        [(name, _tick, _err_at, error, errors)] = tracker.take()
        assert (name, errors) == ("dispatch", 1)
        assert error.startswith("dispatch paused: Redis refuses writes (OOM")

        # Paused: a wake claims nothing until the probe is due.
        paused = loop.run_once()
        assert (paused.paused, paused.claimed) == (True, 0)
        assert loop.wait_timeout() == 1.0

        # The probe is one envelope; Redis still refuses: the pause doubles, still nothing counted.
        clock.now += 1.0
        _due_now()
        probe = loop.run_once()
        assert (probe.claimed, probe.outage_released, probe.dead) == (1, 1, 0)
        assert loop.breaker.seconds_to_probe() == 2.0
        assert _gauge(metrics, "productflow_dispatch_outage_pauses_total") == 1, "still the same pause"

        # Memory is back: the next probe goes through and the drain continues at full batches.
        redis.config_set("maxmemory", 0)
        clock.now += 2.0
        _due_now()
        # A tick: the given-back envelopes read as first sends again, yet only the two never tried count as missed.
        resumed = loop.run_once()
        assert (resumed.dispatched, resumed.dead, resumed.batch_sizes, resumed.unannounced) == (7, 0, [1, 5, 1], 2)
        assert loop.breaker.state == "closed"
        assert _gauge(metrics, "productflow_redis_circuit_open") == 0
        [(_n, _t, _e, error, errors)] = tracker.take()
        assert error.startswith("dispatch resumed (was dispatch paused: Redis refuses writes (OOM") and errors == 1
    finally:
        loop.close()

    assert DispatchEnvelope.objects.filter(status="dispatched", send_attempts=1).count() == 7
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status="queued").count() == 7
    assert redis.llen("rq:queue:delivery") == 7


def test_a_read_only_replica_pauses_dispatch_too(private_redis):
    conf = loop_settings(BATCH_SIZE=5, SEND_CHUNK_SIZE=5, MAX_SEND_ATTEMPTS=1)
    redis = private_redis.client()
    # A replica of a master that is not there: READONLY for every write (the private server only).
    redis.replicaof("127.0.0.1", 9)
    submit_many([("delivery", PAYLOADS["delivery"])] * 3)
    loop = DispatchLoop(conf, publisher=Publisher(conf, redis), clock=Clock())
    try:
        result = loop.run_once()
    finally:
        loop.close()
        redis.replicaof("NO", "ONE")
    assert "read-only" in result.outage and result.dead == 0
    assert DispatchEnvelope.objects.filter(status="pending", send_attempts=0).count() == 3


class CountingPublisher(Publisher):
    def __init__(self, conf, connection):
        super().__init__(conf, connection)
        self.sends = 0

    def send(self, chunk):
        self.sends += 1
        return super().send(chunk)


def test_after_a_refusal_the_batchs_other_chunks_are_not_sent(private_redis):
    """One wave waits out a refusal, not every wave: the rest of the batch is given back unsent, uncounted."""
    conf = loop_settings(BATCH_SIZE=6, SEND_CHUNK_SIZE=2, SEND_CONCURRENCY=1, MAX_SEND_ATTEMPTS=1)
    redis = private_redis.client()
    redis.config_set("maxmemory-policy", "noeviction")
    redis.config_set("maxmemory", 1)
    submit_many([("delivery", PAYLOADS["delivery"])] * 6)
    publisher = CountingPublisher(conf, redis)
    loop = DispatchLoop(conf, publisher=publisher, clock=Clock())
    try:
        result = loop.run_once()
    finally:
        loop.close()
    assert (result.claimed, result.outage_released, result.released, publisher.sends) == (6, 6, 0, 1)
    assert set(DispatchEnvelope.objects.values_list("status", "send_attempts", "lease_token")) == {("pending", 0, None)}


def test_a_refusal_met_sending_ahead_pauses_dispatch_before_anything_is_claimed(private_redis):
    """An announced envelope (dispatch.announced) sent ahead of its claim into a refusing Redis: the breaker
    opens there, so the claim does not wait out the same refusal and nothing is claimed or counted."""
    conf = loop_settings(BATCH_SIZE=5, SEND_CHUNK_SIZE=5, MAX_SEND_ATTEMPTS=1)
    redis = private_redis.client()
    redis.config_set("maxmemory-policy", "noeviction")
    redis.config_set("maxmemory", 1)
    [job] = submit_many([("delivery", PAYLOADS["delivery"])])
    envelope = DispatchEnvelope.objects.get(job=job)
    publisher = CountingPublisher(conf, redis)
    loop = DispatchLoop(conf, publisher=publisher, clock=Clock())
    loop.wake.announced.append(Claimed(envelope.id, job.id, 1, "delivery", envelope.queue, 0, True))
    try:
        result = loop.run_once(NOTIFY)
    finally:
        loop.close()
    assert result.paused and "OOM" in loop.breaker.reason
    assert (publisher.sends, result.claimed, result.dead) == (1, 0, 0)
    envelope.refresh_from_db()
    assert (envelope.status, envelope.send_attempts, envelope.lease_token) == ("pending", 0, None)
