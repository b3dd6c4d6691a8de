"""The writer's own send (``DISPATCH['SUBMIT_SENDS']``): a submit's envelopes to RQ right after its commit.

With it a job's path from commit to start has no dispatcher on it: the submit's statement leases the envelopes
it inserts to their writer (``store.writer_lease``), announces none of them, and once the transaction commits
(``transaction.on_commit``: never before, never after a rollback) this module sends them with the dispatcher's
own create-if-absent send (``rq.publish``). The worker's start marks such an envelope dispatched. At a
hundred jobs a second that is one PostgreSQL round trip per job fewer than a dispatcher's send-ahead (the
listener's read of each NOTIFY), and one process fewer between the commit and the job's first line.

A send that fails is not retried here and never raised to the caller: its job is committed, and the dispatcher
claims and sends the envelope once ``SUBMIT_SEND_GRACE`` is over. A Redis refusing as a whole (unreachable,
OOM, READONLY, ...) also stops writer sends for ``RECONNECT_BACKOFF_MAX``: meanwhile every submit leaves its
envelopes to the dispatcher, announced as without this setting, so an outage costs no submit a timeout after
the first and no job the grace.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import dispatch_app.config.failpoints as failpoints
import dispatch_app.dispatch.foreign as foreign
from dispatch_app.config.settings import cached_settings, dispatch_settings
from dispatch_app.dispatch.breaker import outage_reason
from dispatch_app.rq.publish import Publisher
from dispatch_app.store.api import Claimed

log = logging.getLogger("dispatch_app.dispatch")


class WriterSend:
    """What ``outbox.submit_many`` calls when it may send its own envelopes (``outbox.install_writer_send``).

    ``ready()``: whether the next submit sends its own (the setting is on, no outage in the last backoff).
    ``send(rows)``: (envelope id, job id, attempt, domain, queue) per envelope, called after the commit.
    ``publisher``: a factory, so the Redis connections are made on the first send, not at import.
    """

    def __init__(self, publisher: Callable[[], Publisher] | None = None, clock=time.monotonic):
        self._factory = publisher or (lambda: Publisher(dispatch_settings()))
        self._publisher: Publisher | None = None
        self._lock = threading.Lock()
        self._clock = clock
        self._paused_until = 0.0

    def ready(self) -> bool:
        return cached_settings().SUBMIT_SENDS and self._clock() >= self._paused_until

    def send(self, rows: list[tuple[int, int, int, str, str]]) -> int:
        """Send the committed envelopes; returns how many Redis created. Never raises."""
        envelopes = [Claimed(e, j, a, d, q, send_attempts=0, first_send=True) for e, j, a, d, q in rows]
        created = 0
        failpoints.hit("kill_before_writer_send")  # committed, not sent (fault suite, scenario 48)
        try:
            publisher = self._get_publisher()
            for chunk in publisher.group_by_server(envelopes).values():
                result = publisher.send(chunk)
                created += result.sent
                foreign.note(result.foreign, "writer")
                for envelope, exc in result.failed:
                    self._failed([envelope], exc)
        except Exception as exc:  # noqa: BLE001 - the job is committed: the dispatcher sends it after the grace
            self._failed(envelopes, exc)
        return created

    def _get_publisher(self) -> Publisher:
        with self._lock:
            if self._publisher is None:
                self._publisher = self._factory()
            return self._publisher

    def _failed(self, envelopes: list[Claimed], exc: BaseException) -> None:
        reason = outage_reason(exc)
        backoff = cached_settings().RECONNECT_BACKOFF_MAX
        if reason is not None:
            self._paused_until = self._clock() + backoff
        log.warning(
            "%d envelope(s) not sent by their writer (%s: %s)%s; the dispatcher sends them once "
            "SUBMIT_SEND_GRACE is over",
            len(envelopes),
            type(exc).__name__,
            exc,
            f", and writers leave theirs to the dispatcher for {backoff:g} s ({reason})" if reason else "",
            extra={"action": "submit_send_failed", "domain": envelopes[0].domain if envelopes else "dispatch"},
        )
