"""The dispatch loop: wait for a wake or the fallback tick, then drain.

One drain claims a batch, sends it, records the results and claims the next
batch at once while batches come back full, so a backlog never waits (K-1)
ticks. It stops on an empty or short batch, on an error, or when told to stop.

A server-wide Redis refusal (OOM, READONLY, unreachable, ...) pauses it
(``dispatch.breaker``): no claims until a probe batch goes through, and the
envelopes in flight are given back without counting the attempt.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

from django.db import connection

from dispatch_app import failpoints
from dispatch_app.conf import DispatchSettings, check_lease
from dispatch_app.dispatch import claim, outage
from dispatch_app.dispatch.breaker import CLOSED, BreakerState, CircuitBreaker, outage_reason
from dispatch_app.dispatch.claim import Claimed
from dispatch_app.dispatch.marker import Marker
from dispatch_app.dispatch.publisher import PermanentSendError, Publisher
from dispatch_app.dispatch.sender import BoundedSender
from dispatch_app.runtime.wake import TICK, Wake

log = logging.getLogger("dispatch_app.dispatch")

# The first pause probes after this long even when SEND_BACKOFF_BASE is 0 (no busy probing).
MIN_PROBE_BACKOFF = 0.1
# Bounds the memory of given-back envelope ids (beyond it, a long outage's backlog may count as missed wake-ups).
MAX_REMEMBERED_GIVE_BACKS = 100_000


def check_send_lease(conf: DispatchSettings, publisher: Publisher | None = None) -> float:
    """At start-up: LEASE_SECONDS must outlast the worst case of a batch's sends on this Redis (conf.check_lease)."""
    return check_lease(conf, **(publisher or Publisher(conf)).send_limits())


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
    outage_released: int = 0  # given back uncounted: Redis as a whole refused (never dead-lettered)
    outage: str = ""  # why Redis as a whole refused this drain's sends (breaker.outage_reason), if it did
    # The breaker after this drain (set by run_once, for the heartbeat and the metrics).
    breaker: BreakerState = field(default_factory=lambda: BreakerState(CLOSED))
    paused: bool = False  # nothing was claimed: the breaker is open and its probe is not due
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
            "outage_released",
            "connect_seconds",
            "claim_seconds",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.outage = self.outage or other.outage
        self.batch_sizes.extend(other.batch_sizes)
        self.latencies.extend(other.latencies)


@dataclass
class _BatchRecord:
    """What the sends of one batch did, waiting to be written."""

    token: uuid.UUID
    sent_ids: list[int] = field(default_factory=list)
    skipped_ids: list[int] = field(default_factory=list)
    failures: dict[str, list[int]] = field(default_factory=dict)
    permanent: list[tuple[Claimed, str]] = field(default_factory=list)
    outage_ids: list[int] = field(default_factory=list)
    outage_error: str = ""
    outage_delay: float = 0.0


class _Halt:
    """The sender's stop for one batch: the loop's stop signal, or Redis refusing as a whole.

    Once one chunk finds Redis refusing (or hanging until the timeout), the
    batch's chunks not yet started are not sent: each would wait out the same
    refusal, and the lease must only cover one wave of them.
    """

    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.outage = threading.Event()

    def is_set(self) -> bool:
        return self.stop.is_set() or self.outage.is_set()

    def watching(self, send):
        def watched(chunk):
            try:
                return send(chunk)
            except Exception as exc:
                if outage_reason(exc) is not None:
                    self.outage.set()
                raise

        return watched


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
        clock=time.monotonic,
    ):
        self.conf = conf
        self.wake = wake or Wake()
        self.stop = stop or threading.Event()
        self.publisher = publisher or Publisher(conf)
        self.sender = sender or BoundedSender(conf.SEND_CONCURRENCY, name="dispatch-send")
        self.observer = observer  # metrics hook: observer.drained(result)
        self.scans = 0
        self._marker = Marker()
        # Envelopes this process gave back during an outage: their attempt was taken back, so the next claim
        # reads as a first send, but a tick that finds them again is no missed wake-up.
        self._given_back: set[int] = set()
        self.breaker = CircuitBreaker(
            max(conf.SEND_BACKOFF_BASE, MIN_PROBE_BACKOFF),
            max(min(conf.SEND_BACKOFF_MAX, conf.SEND_TRANSIENT_BACKOFF_MAX), MIN_PROBE_BACKOFF, conf.SEND_BACKOFF_BASE),
            clock=clock,
        )

    def wait(self) -> str:
        return self.wake.wait(self.wait_timeout())

    def wait_timeout(self) -> float:
        # Paused: wake for the probe when it is due, not a whole tick later.
        probe_in = self.breaker.seconds_to_probe()
        return self.conf.POLL_INTERVAL if probe_in is None else min(self.conf.POLL_INTERVAL, probe_in)

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
        if not self.breaker.allow():
            total.paused = True
            return self._report(total)
        in_flight: Future | None = None
        try:
            while not self.stop.is_set():
                # While paused, the probe is one envelope: a refusing Redis costs one give-back, not a batch.
                limit = 1 if self.breaker.probing else self.conf.BATCH_SIZE
                result, record = self._claim_and_send(trigger, limit)
                self._judge(result, record)
                if in_flight is not None:
                    previous, in_flight = in_flight, None
                    self._collect(total, previous, result, record)
                # A refusing Redis would refuse the next batch too: the breaker decides when to try again.
                more = result.claimed >= limit and not result.outage
                if more and not self.stop.is_set():
                    in_flight = self._marker.submit(self._record_in_background, result, record)
                    continue
                total.add(self._record(result, record))
                break
        finally:
            if in_flight is not None:
                total.add(in_flight.result())
        return self._report(total)

    def _collect(self, total: DrainResult, previous: Future, result: DrainResult, record) -> None:
        """Add batch N's written results; if writing them failed, still write batch N+1's, then raise.

        Batch N+1 is already sent: dropping its marks would leave its envelopes
        leased until the lease runs out and then sent again. Batch N's come back
        the same way, and their re-send is a no-op in Redis.
        """
        try:
            total.add(previous.result())
        except Exception:
            try:
                total.add(self._record(result, record))
            except Exception:
                log.exception(
                    "recording a batch after the previous batch's marks failed also failed",
                    extra={"action": "mark_failed", "domain": "dispatch"},
                )
            raise

    def _record_in_background(self, result: DrainResult, record: _BatchRecord | None) -> DrainResult:
        failpoints.hit("fail_background_mark")
        return self._record(result, record)

    def _judge(self, result: DrainResult, record: _BatchRecord | None) -> None:
        """Tell the breaker what Redis did with this batch (on the loop's thread, before its results are written)."""
        if record is None:
            return  # nothing claimed: Redis was not asked; a half-open breaker probes with the next batch
        if result.outage:
            record.outage_delay = self.breaker.failed(result.outage, record.outage_error)
            return
        if record.sent_ids or record.failures:
            paused = self.breaker.succeeded()
            if paused:
                log.warning(
                    "dispatch resumed after %.1fs: Redis takes sends again",
                    paused,
                    extra={"action": "dispatch_resumed", "domain": "dispatch"},
                )

    def _report(self, total: DrainResult) -> DrainResult:
        total.breaker = self.breaker.snapshot()
        if self.observer is not None:
            self.observer.drained(total)
        # Conditional NOTIFY (dispatch.arming): where a drain ends, arm before going idle or stay disarmed while busy.
        self.wake.drained(total)
        return total

    def dispatch_batch(self, trigger: str = TICK) -> DrainResult:
        """One batch, start to finish: claim, send, record."""
        result, record = self._claim_and_send(trigger)
        self._judge(result, record)
        return self._record(result, record)

    def _claim_and_send(self, trigger: str, limit: int | None = None) -> tuple[DrainResult, _BatchRecord | None]:
        conf = self.conf
        result = DrainResult(trigger=trigger)
        # Measured apart: waiting for a connection (a reconnect, a pool) vs the claim
        # transaction itself (row locks are SKIP LOCKED, so this bounds the lock wait).
        started = time.perf_counter()
        connection.ensure_connection()
        connected = time.perf_counter()
        batch = claim.claim_batch(limit or conf.BATCH_SIZE, conf.LEASE_SECONDS)
        result.connect_seconds = connected - started
        result.claim_seconds = time.perf_counter() - connected
        result.claimed = len(batch.envelopes)
        if not batch.envelopes:
            return result, None
        result.batches = 1
        result.batch_sizes.append(result.claimed)
        if trigger == TICK:
            given_back = self._given_back
            result.unannounced = sum(1 for e in batch.envelopes if e.first_send and e.envelope_id not in given_back)
        if self._given_back:
            self._given_back.difference_update(e.envelope_id for e in batch.envelopes)

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
        halt = _Halt(self.stop)
        outcomes = self.sender.map(halt.watching(self.publisher.send), chunks, stop=halt)
        failpoints.hit("kill_after_send")

        for outcome in outcomes:
            ids = [e.envelope_id for e in outcome.item]
            if outcome.skipped and halt.outage.is_set() and not self.stop.is_set():
                # Never sent: an earlier chunk found Redis refusing. Given back with the batch, uncounted.
                record.outage_ids.extend(ids)
            elif outcome.skipped:
                record.skipped_ids.extend(ids)
            elif outcome.ok:
                failed = outcome.value.failed
                bad = {e.envelope_id for e, _ in failed}
                record.sent_ids.extend(i for i in ids if i not in bad)
                result.duplicates += outcome.value.duplicates
                for envelope, exc in failed:
                    self._envelope_failed(record, [envelope.envelope_id], exc)
            else:
                reason = outage_reason(outcome.error)
                error = f"{type(outcome.error).__name__}: {outcome.error}"
                if reason is None:
                    self._envelope_failed(record, ids, outcome.error)
                    continue
                record.outage_ids.extend(ids)
                if not result.outage:
                    result.outage, record.outage_error = reason, error
        if record.outage_ids:
            log.warning(
                "dispatch paused: %s (%s); %d envelopes given back uncounted",
                result.outage,
                record.outage_error,
                len(record.outage_ids),
                extra={"action": "dispatch_paused", "domain": "dispatch"},
            )
        return result, record

    @staticmethod
    def _envelope_failed(record: _BatchRecord, ids: list[int], exc: BaseException) -> None:
        """An error of these envelopes' own: it counts toward their MAX_SEND_ATTEMPTS."""
        error = f"{type(exc).__name__}: {exc}"
        record.failures.setdefault(error, []).extend(ids)
        log.warning(
            "send failed for %d envelopes: %s", len(ids), error, extra={"action": "send_failed", "domain": "dispatch"}
        )

    def _record(self, result: DrainResult, record: _BatchRecord | None) -> DrainResult:
        """Write what the sends did: compare-and-set marks, backoffs, dead letters, released leases."""
        if record is None:
            return result
        marked = claim.mark_dispatched(record.sent_ids, record.token, result.latencies)
        result.dispatched = marked
        result.lost_lease = len(record.sent_ids) - marked
        if result.lost_lease:
            log.warning(
                "%d sent envelopes were re-claimed by another dispatcher before this one marked them",
                result.lost_lease,
                extra={"action": "lease_lost", "domain": "dispatch"},
            )
        for error, ids in record.failures.items():
            self._record_failure(result, ids, record.token, error, permanent=False)
        for envelope, reason in record.permanent:
            self._record_failure(result, [envelope.envelope_id], record.token, reason, permanent=True)
            log.error(
                "envelope %s dead: %s",
                envelope.envelope_id,
                reason,
                extra={"action": "envelope_dead", "domain": envelope.domain},
            )
        result.released = claim.release(record.skipped_ids, record.token)
        note = f"dispatch paused: {result.outage}: {record.outage_error}"
        result.outage_released = outage.give_back(record.outage_ids, record.token, note, record.outage_delay)
        # Outage batches are recorded on the loop's thread (they never continue the drain), as is every claim.
        if record.outage_ids and len(self._given_back) < MAX_REMEMBERED_GIVE_BACKS:
            self._given_back.update(record.outage_ids)
        return result

    def _record_failure(self, result: DrainResult, ids: list[int], token, error: str, *, permanent: bool) -> None:
        conf = self.conf
        statuses = claim.mark_failed(
            ids,
            token,
            error,
            permanent=permanent,
            max_attempts=conf.MAX_SEND_ATTEMPTS,
            backoff_base=conf.SEND_BACKOFF_BASE,
            backoff_cap=conf.SEND_BACKOFF_MAX,
        )
        result.dead += sum(1 for s in statuses.values() if s == "dead")
        result.failed += sum(1 for s in statuses.values() if s == "pending")

    def close(self) -> None:
        self.sender.close()
        self._marker.close()
