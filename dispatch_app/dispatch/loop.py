"""The dispatch loop: wait for a wake or the fallback tick, then drain.

One drain claims a batch, sends it, records the results and claims the next
batch at once while batches come back full, so a backlog never waits (K-1)
ticks. It stops on an empty or short batch, on an error, or when told to stop.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

import redis
from django.db import connection

from dispatch_app import failpoints
from dispatch_app.conf import DispatchSettings
from dispatch_app.dispatch import claim
from dispatch_app.dispatch.claim import Claimed
from dispatch_app.dispatch.marker import Marker
from dispatch_app.dispatch.publisher import PermanentSendError, Publisher
from dispatch_app.dispatch.sender import BoundedSender
from dispatch_app.runtime.wake import TICK, Wake

log = logging.getLogger("dispatch_app.dispatch")

# Redis itself is unreachable or slow: says nothing about the envelopes.
TRANSIENT_ERRORS = (redis.ConnectionError, redis.TimeoutError)


@dataclass
class DrainResult:
    trigger: str = TICK
    batches: int = 0
    claimed: int = 0
    dispatched: int = 0
    duplicates: int = 0
    failed: int = 0
    dead: int = 0
    released: int = 0
    lost_lease: int = 0
    unannounced: int = 0  # first sends found by a tick-triggered scan: a missed wake-up
    transient_failures: int = 0  # envelopes whose send failed because Redis did (never dead-lettered)
    batch_sizes: list[int] = field(default_factory=list)
    # For the metrics (dispatch_app.ops.metrics): outbox waits of the envelopes marked
    # dispatched (s, database clock), and host time spent getting a connection / claiming.
    latencies: list[float] = field(default_factory=list)
    connect_seconds: float = 0.0
    claim_seconds: float = 0.0

    def add(self, other: DrainResult) -> None:
        for name in (
            "batches",
            "claimed",
            "dispatched",
            "duplicates",
            "failed",
            "dead",
            "released",
            "lost_lease",
            "unannounced",
            "transient_failures",
            "connect_seconds",
            "claim_seconds",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.batch_sizes.extend(other.batch_sizes)
        self.latencies.extend(other.latencies)


@dataclass
class _BatchRecord:
    """What the sends of one batch did, waiting to be written."""

    token: uuid.UUID
    sent_ids: list[int] = field(default_factory=list)
    skipped_ids: list[int] = field(default_factory=list)
    failures: dict[tuple[str, bool], list[int]] = field(default_factory=dict)
    permanent: list[tuple[Claimed, str]] = field(default_factory=list)


class DispatchLoop:
    name = "dispatch"

    def __init__(
        self,
        conf: DispatchSettings,
        *,
        wake: Wake | None = None,
        stop: threading.Event | None = None,
        publisher: Publisher | None = None,
        sender: BoundedSender | None = None,
        observer=None,
    ):
        self.conf = conf
        self.wake = wake or Wake()
        self.stop = stop or threading.Event()
        self.publisher = publisher or Publisher(conf)
        self.sender = sender or BoundedSender(conf.SEND_CONCURRENCY, name="dispatch-send")
        self.observer = observer  # metrics hook: observer.drained(result)
        self.scans = 0
        self._marker = Marker()

    def wait(self) -> str:
        return self.wake.wait(self.conf.POLL_INTERVAL)

    def run_once(self, trigger: str = TICK) -> DrainResult:
        """Drain: batch after batch while they come back full.

        While a full batch's results are written (marker thread, its own
        connection), the next batch is already claimed and sent: the database
        round trips of batch N overlap the Redis sends of batch N+1. At most
        one batch's results are in flight, and all are written before this
        returns.
        """
        total = DrainResult(trigger=trigger)
        self.scans += 1
        in_flight: Future | None = None
        try:
            while not self.stop.is_set():
                result, record = self._claim_and_send(trigger)
                if in_flight is not None:
                    total.add(in_flight.result())
                    in_flight = None
                # A failing Redis would fail the next batch too: wait for the next wake instead.
                more = result.claimed >= self.conf.BATCH_SIZE and not result.transient_failures
                if more and not self.stop.is_set():
                    in_flight = self._marker.submit(self._record, result, record)
                    continue
                total.add(self._record(result, record))
                break
        finally:
            if in_flight is not None:
                total.add(in_flight.result())
        if self.observer is not None:
            self.observer.drained(total)
        return total

    def dispatch_batch(self, trigger: str = TICK) -> DrainResult:
        """One batch, start to finish: claim, send, record."""
        return self._record(*self._claim_and_send(trigger))

    def _claim_and_send(self, trigger: str) -> tuple[DrainResult, _BatchRecord | None]:
        conf = self.conf
        result = DrainResult(trigger=trigger)
        # Measured apart: waiting for a connection (a reconnect, a pool) vs the claim
        # transaction itself (row locks are SKIP LOCKED, so this bounds the lock wait).
        started = time.perf_counter()
        connection.ensure_connection()
        connected = time.perf_counter()
        batch = claim.claim_batch(conf.BATCH_SIZE, conf.LEASE_SECONDS)
        result.connect_seconds = connected - started
        result.claim_seconds = time.perf_counter() - connected
        result.claimed = len(batch.envelopes)
        if not batch.envelopes:
            return result, None
        result.batches = 1
        result.batch_sizes.append(result.claimed)
        if trigger == TICK:
            result.unannounced = sum(1 for e in batch.envelopes if e.first_send)

        record = _BatchRecord(token=batch.token)
        sendable = []
        for envelope in batch.envelopes:
            try:
                self.publisher.check(envelope)
                sendable.append(envelope)
            except PermanentSendError as exc:
                record.permanent.append((envelope, str(exc)))

        size = conf.SEND_CHUNK_SIZE
        chunks = [sendable[i : i + size] for i in range(0, len(sendable), size)]
        outcomes = self.sender.map(self.publisher.send, chunks, stop=self.stop)
        failpoints.hit("kill_after_send")

        for outcome in outcomes:
            ids = [e.envelope_id for e in outcome.item]
            if outcome.skipped:
                record.skipped_ids.extend(ids)
            elif outcome.ok:
                record.sent_ids.extend(ids)
                result.duplicates += outcome.value.duplicates
            else:
                error = f"{type(outcome.error).__name__}: {outcome.error}"
                transient = isinstance(outcome.error, TRANSIENT_ERRORS)
                record.failures.setdefault((error, transient), []).extend(ids)
                if transient:
                    result.transient_failures += len(ids)
                log.warning(
                    "send failed for %d envelopes: %s",
                    len(ids),
                    error,
                    extra={"action": "send_failed", "domain": "dispatch"},
                )
        return result, record

    def _record(self, result: DrainResult, record: _BatchRecord | None) -> DrainResult:
        """Write what the sends did: compare-and-set marks, backoffs, dead letters, released leases."""
        if record is None:
            return result
        marked = claim.mark_dispatched(record.sent_ids, record.token, result.latencies)
        result.dispatched = marked
        result.lost_lease = len(record.sent_ids) - marked
        for (error, transient), ids in record.failures.items():
            self._record_failure(result, ids, record.token, error, permanent=False, transient=transient)
        for envelope, reason in record.permanent:
            self._record_failure(result, [envelope.envelope_id], record.token, reason, permanent=True)
            log.error(
                "envelope %s dead: %s",
                envelope.envelope_id,
                reason,
                extra={"action": "envelope_dead", "domain": envelope.domain},
            )
        result.released = claim.release(record.skipped_ids, record.token)
        return result

    def _record_failure(
        self, result: DrainResult, ids: list[int], token, error: str, *, permanent: bool, transient: bool = False
    ) -> None:
        conf = self.conf
        statuses = claim.mark_failed(
            ids,
            token,
            error,
            permanent=permanent,
            transient=transient,
            max_attempts=conf.MAX_SEND_ATTEMPTS,
            backoff_base=conf.SEND_BACKOFF_BASE,
            backoff_cap=min(conf.SEND_BACKOFF_MAX, conf.SEND_TRANSIENT_BACKOFF_MAX)
            if transient
            else conf.SEND_BACKOFF_MAX,
        )
        result.dead += sum(1 for s in statuses.values() if s == "dead")
        result.failed += sum(1 for s in statuses.values() if s == "pending")

    def close(self) -> None:
        self.sender.close()
        self._marker.close()
