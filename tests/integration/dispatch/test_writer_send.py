"""The writer sends its own envelopes (DISPATCH['SUBMIT_SENDS']), on real PostgreSQL and Redis.

After the commit and never before it, once; the insert wakes no dispatcher; no claim takes the envelope while its
writer's grace lasts, and every claim takes it after; the worker's start marks it dispatched. A writer that never
sends (killed after its commit) or cannot reach Redis loses nothing: the dispatcher sends the job after the grace.
"""

import logging
import uuid

import psycopg
import pytest
import redis
from django.db import connection, transaction
from django.test import override_settings
from rq import Queue
from rq.serializers import JSONSerializer

import dispatch_app.outbox.submit as outbox
import dispatch_app.store.arms as arms
from dispatch_app import submit, submit_many
from dispatch_app.config.settings import NOTIFY_CHANNEL, dispatch_settings
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.wake import TICK
from dispatch_app.dispatch.writer_send import WriterSend
from dispatch_app.models import DispatchEnvelope, DomainPause
from dispatch_app.rq.publish import Publisher, rq_job_id
from dispatch_app.store import transitions
from dispatch_app.store.claim import claim_batch
from dispatch_app.store.writer_lease import WRITER_TOKEN
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)

ON = override_settings(DISPATCH={"SUBMIT_SENDS": True})


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Recorded(Publisher):
    """The real publisher; each send notes the envelope ids and whether their job was committed right then."""

    def __init__(self, conf, connection):
        super().__init__(conf, connection)
        self.sends: list[tuple[int, bool]] = []

    def send(self, chunk):
        with psycopg.connect(autocommit=True, **listener_conninfo()) as other:
            for envelope in chunk:
                seen = other.execute("SELECT 1 FROM dispatch_app_job WHERE id = %s", [envelope.job_id]).fetchone()
                self.sends.append((envelope.envelope_id, seen is not None))
        return super().send(chunk)


class Installed:
    """A WriterSend on ``publisher`` with a clock the test moves, installed in place of the app's."""

    def __init__(self, publisher):
        self.publisher, self.clock = publisher, Clock()
        self.sender = WriterSend(lambda: publisher, clock=self.clock)
        outbox.install_writer_send(self.sender)


@pytest.fixture
def writers():
    """Installs WriterSends for the test (``writers(publisher)``); the app's is back after, the setting on."""
    previous = outbox.install_writer_send(None)
    with ON:
        yield Installed
    outbox.install_writer_send(previous)


@pytest.fixture
def writer(writers, redis_conn):
    return writers(Recorded(dispatch_settings(), redis_conn))


def _rq_ids(redis_conn) -> list[str]:
    return Queue("delivery", connection=redis_conn, serializer=JSONSerializer).job_ids


def _envelope(job) -> DispatchEnvelope:
    return DispatchEnvelope.objects.get(job=job, attempt=1)


def test_a_submit_sends_its_envelope_once_after_its_commit_and_no_claim_takes_it(writer, redis_conn):
    with psycopg.connect(autocommit=True, **listener_conninfo()) as armer:
        armer.execute(arms.ARM_SQL, {"token": uuid.uuid4(), "process": "test", "lease": 3600})
    with psycopg.connect(autocommit=True, **listener_conninfo()) as listen:
        listen.execute(f"LISTEN {NOTIFY_CHANNEL}")
        job = submit("delivery", PAYLOADS["delivery"])
        listen.execute(f"SELECT pg_notify('{NOTIFY_CHANNEL}', 'sentinel')")
        heard = [n.payload for n in listen.notifies(timeout=10, stop_after=1)]
    envelope = _envelope(job)
    assert heard == ["sentinel"], "an envelope its writer sends wakes no dispatcher"
    assert writer.publisher.sends == [(envelope.id, True)], "sent once, after the commit"
    assert _rq_ids(redis_conn) == [rq_job_id(job.id, 1)]
    assert (envelope.status, envelope.lease_token, envelope.send_attempts) == ("pending", WRITER_TOKEN, 0)
    assert claim_batch(10, 30).envelopes == [], "within the grace no claim takes it"


def test_the_start_marks_a_writer_sent_envelope_dispatched_at_the_start(writer, redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    with connection.cursor() as cursor:
        assert transitions.start(cursor, "w1", job.id, 1, ["delivery"]) is not None
    job.refresh_from_db()
    envelope = _envelope(job)
    assert (envelope.status, envelope.lease_token) == ("dispatched", None)
    assert envelope.dispatched_at == job.started_at == job.dispatched_at
    assert claim_batch(10, 30, writer_grace=0.1).envelopes == []


def test_inside_a_transaction_the_send_waits_for_the_commit_and_a_rollback_sends_nothing(writer, redis_conn):
    with transaction.atomic():
        kept = submit("delivery", PAYLOADS["delivery"])
        assert writer.publisher.sends == [] and _rq_ids(redis_conn) == []
    assert [e for e, _ in writer.publisher.sends] == [_envelope(kept).id]
    with pytest.raises(RuntimeError), transaction.atomic():
        submit("delivery", PAYLOADS["delivery"])
        raise RuntimeError("the caller's rollback")
    assert len(writer.publisher.sends) == 1
    assert _rq_ids(redis_conn) == [rq_job_id(kept.id, 1)]


def test_delayed_paused_and_bulk_submits_are_left_to_the_dispatcher(writer, redis_conn):
    from datetime import timedelta

    delayed = submit("delivery", PAYLOADS["delivery"], available_at=timedelta(seconds=60))
    bulk = submit_many([("delivery", PAYLOADS["delivery"])] * 9)
    DomainPause.objects.create(domain="workflow", paused_by="test")
    paused = submit("workflow", PAYLOADS["workflow"])
    leased = DispatchEnvelope.objects.filter(job__in=[delayed, paused, *bulk], lease_token__isnull=False)
    assert not leased.exists()
    assert writer.publisher.sends == []


def test_off_by_default_the_envelope_is_the_dispatchers(redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    assert _envelope(job).lease_token is None
    assert _rq_ids(redis_conn) == []


def test_a_writer_killed_after_its_commit_loses_nothing_the_dispatcher_sends_after_the_grace(writer, redis_conn):
    writer.sender.send = lambda rows: 0  # the process died between its commit and its send
    job = submit("delivery", PAYLOADS["delivery"])
    conf = loop_settings(SUBMIT_SEND_GRACE=0.5)
    loop = DispatchLoop(conf, publisher=Publisher(conf, redis_conn))
    try:
        assert loop.run_once(TICK).claimed == 0, "the writer's grace still runs"
        DispatchEnvelope.objects.filter(job=job).update(available_at=_db_now_minus(1))
        result = loop.run_once(TICK)
    finally:
        loop.close()
    assert (result.claimed, result.dispatched) == (1, 1)
    assert _rq_ids(redis_conn) == [rq_job_id(job.id, 1)]
    assert _envelope(job).status == "dispatched"


def test_a_redis_outage_is_logged_and_later_submits_are_announced_until_the_backoff_ends(writers, caplog):
    writer = writers(Publisher(dispatch_settings(), redis.Redis(port=1, socket_connect_timeout=0.5)))
    with caplog.at_level(logging.WARNING, logger="dispatch_app.dispatch"):
        first = submit("delivery", PAYLOADS["delivery"])
    failed = [r for r in caplog.records if getattr(r, "action", "") == "submit_send_failed"]
    assert len(failed) == 1 and "ConnectionError" in failed[0].getMessage()
    assert _envelope(first).lease_token == WRITER_TOKEN, "left leased: the dispatcher takes it after the grace"
    second = submit("delivery", PAYLOADS["delivery"])
    assert _envelope(second).lease_token is None, "within the backoff the dispatcher sends it, announced"
    writer.clock.now += dispatch_settings().RECONNECT_BACKOFF_MAX
    assert writer.sender.ready()


def _db_now_minus(seconds: float):
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp() - make_interval(secs => %s)", [seconds])
        return cursor.fetchone()[0]


def test_the_operator_is_told_the_writer_sent_it_not_that_it_waits_for_a_claim(writers, redis_conn):
    from dispatch_app.views import blockers

    writers(Publisher(dispatch_settings(), redis_conn))
    job = submit("delivery", PAYLOADS["delivery"])
    with connection.cursor() as cursor:
        envelope = blockers.envelopes_of(cursor, [job.id])[job.id]
    blocker = blockers.outbox("submitted", 1, envelope, None, dispatcher_alive=True)
    assert blocker.kind == "writer" and "sent to RQ by its writer" in blocker.text, blocker
