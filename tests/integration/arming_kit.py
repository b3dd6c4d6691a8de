"""The harness of the conditional-NOTIFY tests: a writer held inside its transaction, a dispatcher driven from
the test thread, and what the commits announced (read up to a sentinel NOTIFY)."""

from __future__ import annotations

import threading

from django.db import connection, connections, transaction

from dispatch_app import submit
from dispatch_app.dispatch.announced import parse
from dispatch_app.dispatch.arming import Arming
from dispatch_app.dispatch.listener import Listener
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.wake import CATCH_UP, STOP, Wake
from dispatch_app.models import DispatchEnvelope
from dispatch_app.rq.publish import Publisher
from tests.factories import PAYLOADS
from tests.integration.dispatch.test_notify import received_until_sentinel
from tests.integration.loop_kit import loop_settings


class HeldWriter(threading.Thread):
    """submit() in its own transaction, held open after the INSERT (its trigger has run) until released."""

    def __init__(self, isolation: str | None = None, before_insert: threading.Event | None = None):
        super().__init__(daemon=True)
        self.isolation = isolation
        self.before_insert = before_insert
        self.inserted = threading.Event()
        self.snapshot_taken = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()
        self.xid: str | None = None
        self.job = None
        self.error: BaseException | None = None

    def run(self):
        try:
            with transaction.atomic():
                if self.isolation:
                    with connection.cursor() as cursor:
                        cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {self.isolation}")
                        cursor.execute("SELECT count(*) FROM dispatch_app_notifyarm")  # the snapshot is taken here
                    self.snapshot_taken.set()
                    assert self.before_insert.wait(10)
                self.job = submit("delivery", PAYLOADS["delivery"])
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_current_xact_id()::text")
                    self.xid = cursor.fetchone()[0]
                self.inserted.set()
                assert self.release.wait(10), "never released"
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self.error = exc
        finally:
            connections.close_all()
            self.done.set()

    def commit(self):
        self.release.set()
        assert self.done.wait(10)
        assert self.error is None, self.error


class Dispatcher:
    """A dispatch loop and its arming, driven from the test thread; optionally a real Listener on the same wake."""

    def __init__(self, redis_conn, *, listener: bool = False, clock=None):
        self.conf = loop_settings(BATCH_SIZE=10)
        self.wake = Wake()
        self.stop = threading.Event()
        self.listening = threading.Event()
        self.listener = None
        if listener:
            self.listener = Listener(self.conf, self.wake, self.stop)
            self.arming = self.wake.arming
        else:
            self.listening.set()
            kwargs = {"clock": clock} if clock else {}
            self.arming = Arming(self.conf, self.wake, listening=self.listening, stop=self.stop, **kwargs)
            self.wake.arming = self.arming
        self.loop = DispatchLoop(self.conf, wake=self.wake, stop=self.stop, publisher=Publisher(self.conf, redis_conn))

    def start_listening(self):
        self.listener.start()
        assert self.listener.connected.wait(10)
        assert self.wake.wait(10) == CATCH_UP

    def scan(self, trigger):
        return self.loop.run_once(trigger)

    def close(self):
        self.stop.set()
        self.wake.set(STOP)
        if self.listener is not None:
            assert self.listener.join(10)
        self.loop.close()


def dispatchers(redis_conn):
    """The body of a test module's ``dispatcher`` fixture: a maker of Dispatchers, each closed at the end."""
    made = []

    def make(**kwargs):
        d = Dispatcher(redis_conn, **kwargs)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def armed_rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dispatch_app_notifyarm WHERE armed_until > clock_timestamp()")
        return cursor.fetchone()[0]


def status(job) -> str:
    return DispatchEnvelope.objects.get(job=job).status


def announced(listen, sentinel) -> list[str]:  # noqa: F811
    """The domains the commits so far announced: one per envelope a payload names (dispatch.announced)."""
    sentinel()
    got = []
    for payload in received_until_sentinel(listen)[:-1]:
        named = parse(payload)
        got.extend([e.domain for e in named] if named else [payload])
    return got
