"""The dispatch loop: wait for a wake or the fallback tick, then drain.

One drain claims a batch, sends it, records the results and claims the next
batch at once while batches come back full, so a backlog never waits (K-1)
ticks. It stops on an empty or short batch, on an error, or when told to stop.

A server-wide Redis refusal (OOM, READONLY, unreachable, ...) pauses it
(``dispatch.breaker``): no claims until a probe batch goes through, and the
envelopes in flight are given back without counting the attempt.

There is one breaker per Redis server (each domain's queue lives on the server
its ``RQ_QUEUES`` entry names): a batch's envelopes are grouped by server, one
server's outage gives back only its own envelopes (uncounted, until its probe)
and the domains on the other servers keep dispatching (the grouping and the
sorting of the sends' outcomes: ``dispatch.sends``).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from django.db import connection

import dispatch_app.config.failpoints as failpoints
import dispatch_app.dispatch.announced as announced
import dispatch_app.store.api as store
from dispatch_app.config.settings import DispatchSettings, check_lease
from dispatch_app.config.tuning import MAX_REMEMBERED_GIVE_BACKS
from dispatch_app.dispatch.breaker import CircuitBreaker
from dispatch_app.dispatch.breakers import Breakers
from dispatch_app.dispatch.drain_result import DrainResult
from dispatch_app.dispatch.marker import Marker
from dispatch_app.dispatch.sender import BoundedSender
from dispatch_app.dispatch.sends import BatchRecord, Halt, chunks, sort_outcomes
from dispatch_app.dispatch.wake import DUE, MARK, NOTIFY, TICK, Wake
from dispatch_app.rq.publish import PermanentSendError, Publisher

log = logging.getLogger("dispatch_app.dispatch")


def check_send_lease(conf: DispatchSettings, publisher: Publisher | None = None) -> float:
    """At start-up: LEASE_SECONDS must outlast the worst case of a batch's sends on this Redis (conf.check_lease)."""
    return check_lease(conf, **(publisher or Publisher(conf)).send_limits())


class DispatchLoop:
    name = "dispatch"
    # Its drains are asked for by wakes (capacity one): a drain that failed is run again after the runner's
    # backoff, or the wake spent on it would leave the work it announced until the fallback tick.
    retry_failed_step = True

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
        self._clock = clock
        # When the last claim said the next pending envelope falls due (loop clock), or None.
        self._due_at: float | None = None
        # One breaker per Redis server: one server's outage pauses only the domains whose queues live on it.
        self.breakers = Breakers(conf, self.publisher.servers(), clock)
        # What writers announced in their NOTIFY: sent before any claim, then marked (dispatch.announced).
        self.ahead = announced.SendAhead(
            self.publisher, self.breakers.of, conf.SEND_CHUNK_SIZE, delay=conf.MARK_AHEAD_DELAY, clock=clock
        )

    @property
    def _sent_ahead(self) -> dict[int, tuple[int, float]]:
        return self.ahead.sent

    @property
    def breaker(self) -> CircuitBreaker:
        """The default server's breaker (the only one unless RQ_QUEUES puts domains on their own Redis)."""
        return self.breakers.default

    def wait(self) -> str:
        reason = self.wake.wait(self.wait_timeout())
        due_at = self._due_at
        if reason == TICK and due_at is not None and self._clock() >= due_at:
            self._due_at = None
            return DUE
        if reason == TICK and self.ahead.mark_in() == 0.0:
            return MARK
        return reason

    def wait_timeout(self) -> float:
        # Paused: wake for the earliest probe when it is due, not a whole tick later; and when
        # the last claim saw a pending envelope falling due before the tick, wake for it then.
        waits = self.breakers.seconds_to_probe()
        if self._due_at is not None:
            waits.append(max(0.0, self._due_at - self._clock()))
        # Sent ahead and waiting for their mark: wake to mark them when their delay is up.
        if (mark_in := self.ahead.mark_in()) is not None:
            waits.append(mark_in)
        return min([self.conf.POLL_INTERVAL, *waits])

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
        ahead = self.ahead
        ahead.begin()
        envelopes = announced.take(self.wake.announced)
        if envelopes and self.conf.SEND_ANNOUNCED and not self.stop.is_set():
            total.sends, total.duplicates, total.foreign = ahead.send(envelopes)
        # Every breaker is asked (a due one turns half-open); nothing is claimed while all servers are paused.
        if not self.breakers.allow_any():
            total.paused = True
            return self._report(total)
        in_flight: Future | None = None
        waiting = False  # sent ahead, their mark left to wait
        try:
            # Woken only by announcements, all of them sent: nothing is known to wait in the table (the fallback
            # tick and any other signal still scan it), so there is no claim to make, one statement less per job;
            # their mark may wait to be shared (MARK_AHEAD_DELAY). Woken to mark (MARK): the same, once marked.
            named = self.wake.only_named and trigger == NOTIFY and envelopes
            # A MARK retried after a failed drain finds nothing waiting (forgotten): then it claims.
            covered = bool(named and len(ahead.fresh) == len(envelopes)) or bool(trigger == MARK and ahead.sent)
            if covered and ahead.mark_in() != 0.0 and not self.stop.is_set():
                ahead.count_fresh(total)
                waiting = True
            else:
                ahead.mark(total)
                covered = covered and not ahead.sent
            # A MARK step is no wake with work to find: only a NOTIFY's drain counts as a claim skipped.
            total.claim_skipped = covered and trigger != MARK
            while not covered and not self.stop.is_set():
                # While every server is paused, the probe is one envelope: a refusing Redis costs one give-back.
                limit = self.conf.BATCH_SIZE if self.breakers.any_closed() else 1
                result, record = self._claim_and_send(trigger, limit)
                total.next_due_in = result.next_due_in
                self.breakers.judge(record)
                if in_flight is not None:
                    previous, in_flight = in_flight, None
                    self._collect(total, previous, result, record)
                # A refusing Redis would refuse the next batch too: its breaker decides when to try again.
                # Full: more may be due. So is a claim that took its most re-dispatches (claim.AGAIN_PER_CLAIM).
                full = result.claimed >= limit or result.again_full
                more = full and not (result.outage and not self.breakers.any_closed())
                if more and not self.stop.is_set():
                    in_flight = self._marker.submit(self._record_in_background, result, record)
                    continue
                total.add(self._record(result, record))
                break
        finally:
            # Unless their mark waits: sent ahead but not marked or claimed here (a peer claimed them, or this
            # drain stopped or failed) is left to whoever claims them (SendAhead.forget_unmarked).
            if not waiting:
                ahead.forget_unmarked()
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

    def _record_in_background(self, result: DrainResult, record: BatchRecord | None) -> DrainResult:
        failpoints.hit("fail_background_mark")
        return self._record(result, record)

    def _report(self, total: DrainResult) -> DrainResult:
        total.breaker = self.breakers.state()
        if self.observer is not None:
            self.observer.drained(total)
        # Conditional NOTIFY (dispatch.arming): where a drain ends, arm before going idle or stay disarmed while busy.
        self.wake.drained(total)
        return total

    def dispatch_batch(self, trigger: str = TICK) -> DrainResult:
        """One batch, start to finish: claim, send, record."""
        result, record = self._claim_and_send(trigger)
        self.breakers.judge(record)
        return self._record(result, record)

    def _claim_and_send(self, trigger: str, limit: int | None = None) -> tuple[DrainResult, BatchRecord | None]:
        conf = self.conf
        result = DrainResult(trigger=trigger)
        # Measured apart: waiting for a connection (a reconnect, a pool) vs the claim
        # transaction itself (row locks are SKIP LOCKED, so this bounds the lock wait).
        started = time.perf_counter()
        connection.ensure_connection()
        connected = time.perf_counter()
        batch = store.claim_batch(limit or conf.BATCH_SIZE, conf.LEASE_SECONDS, writer_grace=conf.SUBMIT_SEND_GRACE)
        result.connect_seconds = connected - started
        result.claim_seconds = time.perf_counter() - connected
        result.claimed = len(batch.envelopes)
        result.claimed_first = sum(1 for e in batch.envelopes if e.attempt == 1)
        result.again_full = batch.again_full
        result.next_due_in = batch.next_due_in
        self._due_at = None if batch.next_due_in is None else self._clock() + batch.next_due_in
        if not batch.envelopes:
            return result, None
        result.batches = 1
        result.batch_sizes.append(result.claimed)
        if trigger == TICK:
            given_back = self._given_back
            result.unannounced = sum(1 for e in batch.envelopes if e.first_send and e.envelope_id not in given_back)
        if self._given_back:
            self._given_back.difference_update(e.envelope_id for e in batch.envelopes)

        record = BatchRecord(token=batch.token)
        sendable = []
        for envelope in batch.envelopes:
            try:
                self.publisher.check(envelope)
                sendable.append(envelope)
            except PermanentSendError as exc:
                record.permanent.append((envelope, str(exc)))

        self.ahead.remember([(e.envelope_id, e.attempt) for e in batch.envelopes])
        sendable, done = self.ahead.claimed(sendable)
        if done:
            record.sent_ids.extend(done)
            record.send_started.update(done)
            result.sent_ahead = len(done)

        server_of = self.publisher.server
        batch_chunks = chunks(
            sendable, record, server_of=server_of, breaker_for=self.breakers.of, size=self.conf.SEND_CHUNK_SIZE
        )
        halt = Halt(self.stop, server_of, record.send_started)
        outcomes = self.sender.map(halt.watching(self.publisher.send), batch_chunks, stop=halt)
        failpoints.hit("kill_after_send")
        sort_outcomes(outcomes, record, result, server_of)
        return result, record

    def _record(self, result: DrainResult, record: BatchRecord | None) -> DrainResult:
        """Write what the sends did: compare-and-set marks, backoffs, dead letters, released leases."""
        if record is None:
            return result
        started = record.send_started
        marked = store.mark_dispatched(
            record.sent_ids,
            record.token,
            result.latencies,
            sent_at=[started.get(i) for i in record.sent_ids],
            lease_seconds=self.conf.LEASE_SECONDS,
        )
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
        result.released = store.release(record.skipped_ids, record.token)
        for key, ids in record.outage_ids.items():
            server = key.removeprefix("held:")
            breaker = self.breakers.get(server)
            reason = record.outage_reason.get(server) or (breaker.reason if breaker is not None else "")
            error = record.outage_error.get(server) or (breaker.error if breaker is not None else "")
            note = f"dispatch paused: {reason}: {error}"
            delay = record.outage_delay.get(key, 0.0)
            result.outage_released += store.release(ids, record.token, error=note, delay=delay)
            # Remembered so a tick that finds them again is no missed wake-up (bounded memory).
            if len(self._given_back) < MAX_REMEMBERED_GIVE_BACKS:
                self._given_back.update(ids)
        return result

    def _record_failure(self, result: DrainResult, ids: list[int], token, error: str, *, permanent: bool) -> None:
        conf = self.conf
        statuses = store.mark_failed(
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
        """After the loop's thread stopped: mark what is still waiting for its mark, then let the threads go."""
        if self.ahead.sent:
            try:
                self.ahead.mark(DrainResult(trigger=MARK))
            except Exception:  # left pending: the next claim sends them again, a no-op in Redis
                log.exception(
                    "envelopes sent ahead could not be marked at shutdown",
                    extra={"action": "mark_failed", "domain": "dispatch"},
                )
        self.sender.close()
        self._marker.close()
