"""While batch N's results are written, batch N+1 is already claimed and sent."""

import threading

import psycopg
import pytest
from django.db import connections

from dispatch_app import submit_many
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.rq.publish import Publisher
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)

B = 5


class SecondSendSeen(Publisher):
    def __init__(self, conf, connection):
        super().__init__(conf, connection)
        self.sends = 0
        self.second = threading.Event()
        self._lock = threading.Lock()

    def send(self, chunk):
        with self._lock:
            self.sends += 1
            if self.sends == 2:
                self.second.set()
        return super().send(chunk)


def test_the_next_batch_is_sent_while_the_last_one_is_still_being_recorded(redis_conn):
    conf = loop_settings(BATCH_SIZE=B, SEND_CHUNK_SIZE=B)
    jobs = submit_many([("delivery", PAYLOADS["delivery"])] * (2 * B + 1))
    first_batch = [job.pk for job in jobs[:B]]
    publisher = SecondSendSeen(conf, redis_conn)
    loop = DispatchLoop(conf, publisher=publisher)
    outcome = {}

    def drain_in_thread():
        try:
            outcome["result"] = loop.run_once()
        finally:
            connections.close_all()  # this thread's own connection

    # Batch 1's mark updates its jobs; holding their row locks holds that mark.
    with psycopg.connect(**listener_conninfo()) as blocker:
        blocker.execute("SELECT id FROM dispatch_app_job WHERE id = ANY(%s) FOR UPDATE", [first_batch])
        drain = threading.Thread(target=drain_in_thread)
        drain.start()
        try:
            assert publisher.second.wait(10), "batch 2 was not sent while batch 1's mark was held"
            assert DispatchEnvelope.objects.filter(job_id__in=first_batch, status="pending").count() == B
        finally:
            blocker.commit()
    drain.join(10)
    loop.close()

    assert not drain.is_alive()
    result = outcome["result"]
    assert (result.claimed, result.dispatched, result.batch_sizes) == (2 * B + 1, 2 * B + 1, [B, B, 1])
    assert DispatchEnvelope.objects.filter(status="dispatched").count() == 2 * B + 1
    assert Job.objects.filter(status="queued").count() == 2 * B + 1
