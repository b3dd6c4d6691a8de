"""Envelopes a writer announced in its NOTIFY, sent to RQ before they are claimed.

A small insert (a submit, a worker's retry: at most ANNOUNCE_MAX_ROWS envelopes,
claimable now, of a domain not paused) names its envelopes in the payload
(``store.triggers.notify.NOTIFY_INSERTED``). The listener hands them to the dispatch loop with
its wake; the loop sends them at once and marks them with one compare-and-set
(``store.MARK_AHEAD_SQL``) instead of a claim. The claim's round trip, about a third of the
dispatcher's hop, is then off the job's path from commit to start.

The table stays the record: an announcement is only a head start. A lost or
unreadable one is found by the claim that follows every wake. Sending before the
claim is safe because a send is idempotent (RQ's create-if-absent script leaves
an existing job alone, and the worker's start compare-and-set refuses a second
start of an attempt): several dispatchers hearing the same NOTIFY, or a claim
that finds the envelope taken by a peer, cost a duplicate send, never a second
run. ``DISPATCH["SEND_ANNOUNCED"] = False`` claims first, as before.

The mark waits: envelopes sent ahead gather for ``MARK_AHEAD_DELAY`` (or until
MARK_AHEAD_MAX of them wait) and one statement marks them all. At a hundred jobs
a second an idle dispatcher's mark was one more PostgreSQL backend woken per
job, about a quarter of a job's PostgreSQL CPU (docs/benchmarks.md); the worker's
start never needed it (it accepts a pending, unleased, due envelope), and the
mark still dates the dispatch from the send (``store.mark_ahead``). Meanwhile
the envelope is pending and unleased: this loop marks what it sent before any
claim of its own, and a peer's claim costs a duplicate send, as above.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict, deque

import dispatch_app.dispatch.foreign as foreign
import dispatch_app.rq.servers as redis_servers
import dispatch_app.store.api as store
from dispatch_app.config.settings import ANNOUNCE_PREFIX
from dispatch_app.config.tuning import MARK_AHEAD_MAX, MAX_REMEMBERED_CLAIMS
from dispatch_app.dispatch.breaker import CLOSED, outage_reason
from dispatch_app.rq.publish import PermanentSendError
from dispatch_app.store.api import Claimed

log = logging.getLogger("dispatch_app.dispatch")

PREFIX = ANNOUNCE_PREFIX


class BadAnnouncement(ValueError):
    """A NOTIFY payload that starts like a list of envelopes but is not one."""


def parse(payload: str) -> list[Claimed]:
    """The envelopes a NOTIFY payload names; none for a domain's payload ("worth a scan")."""
    if not payload.startswith(PREFIX):
        return []
    try:
        rows = json.loads(payload[len(PREFIX) :])
        return [
            Claimed(int(envelope), int(job), int(attempt), str(domain), str(queue), send_attempts=0, first_send=True)
            for envelope, job, attempt, domain, queue in rows
        ]
    except (ValueError, TypeError) as exc:
        raise BadAnnouncement(f"NOTIFY payload {payload[:200]!r} is not a list of envelopes: {exc}") from None


def take(announced: deque[Claimed]) -> list[Claimed]:
    """Everything announced so far, in order, leaving the hand-over empty."""
    out = []
    while True:
        try:
            out.append(announced.popleft())
        except IndexError:
            return out


class SendAhead:
    """The dispatch loop's head start: send announced envelopes, mark them, and remember what was claimed.

    ``sent``: envelope id -> (attempt, ``time.monotonic()`` when its send started), sent and not yet marked.
    ``fresh``: envelope id -> attempt of those sent by the current drain (``begin``): the drain that sends an
    envelope counts it as claimed, whichever later drain marks it. ``recent``: envelope id -> attempt of this
    loop's recent claims and marks: an announcement that reaches the loop after the claim that took its envelope
    (the listener hears the NOTIFY while a drain runs) is not sent again. ``delay``: how long sent envelopes may
    wait for their mark (MARK_AHEAD_DELAY), on ``clock``.
    """

    def __init__(self, publisher, breaker_for, chunk_size: int, *, delay: float = 0.0, clock=time.monotonic):
        self.publisher = publisher
        self.breaker_for = breaker_for
        self.chunk_size = chunk_size
        self.delay = delay
        self.clock = clock
        self.sent: dict[int, tuple[int, float]] = {}
        self.fresh: dict[int, int] = {}
        self.recent: OrderedDict[int, int] = OrderedDict()
        self._first_at: float | None = None  # when the oldest envelope still in ``sent`` was sent (``clock``)

    def begin(self) -> None:
        """A drain starts: nothing is fresh yet."""
        self.fresh = {}

    def mark_in(self) -> float | None:
        """Seconds until what was sent must be marked (0: now); None when nothing waits."""
        if not self.sent:
            self._first_at = None
            return None
        if self._first_at is None or len(self.sent) >= MARK_AHEAD_MAX:
            return 0.0
        left = self._first_at + self.delay - self.clock()
        return left if left > 1e-6 else 0.0  # a microsecond's rounding is due: the wait would spin for it

    def forget_unmarked(self) -> None:
        """Sent and not marked here (a peer claimed them, a pause, a failed drain): whoever claims them sends
        them again, which RQ's create-if-absent script makes a no-op."""
        self.sent.clear()
        self._first_at = None

    def send(self, envelopes: list[Claimed]) -> tuple[int, int, int]:
        """Send now what was announced (not what this loop claimed already).

        Returns (sent, of which duplicates, of which in place of a foreign hash)."""
        unsent = []
        for envelope in envelopes:
            if self.recent.get(envelope.envelope_id) == envelope.attempt:
                continue
            if (sent := self.sent.get(envelope.envelope_id)) is not None and sent[0] == envelope.attempt:
                continue  # announced again (a re-arm's NOTIFY) while its mark waits
            try:
                self.publisher.check(envelope)
            except PermanentSendError:
                continue  # the claim dead-letters it with the reason
            unsent.append(envelope)
        sends = duplicates = foreign_hashes = 0
        size = self.chunk_size
        for server, ahead in self.publisher.group_by_server(unsent).items():
            if self.breaker_for(server).state != CLOSED:
                continue  # a paused or probing server gets nothing ahead of its breaker
            for start in range(0, len(ahead), size):
                chunk = ahead[start : start + size]
                at = time.monotonic()
                try:
                    result = self.publisher.send(chunk)
                except Exception as exc:  # noqa: BLE001 - unsent: the claim sends them as it always did
                    self._failed(server, exc)
                    break
                failed = {envelope.envelope_id for envelope, _ in result.failed}
                if not self.sent:
                    self._first_at = self.clock()
                done = [e for e in chunk if e.envelope_id not in failed]
                self.sent.update((e.envelope_id, (e.attempt, at)) for e in done)
                self.fresh.update((e.envelope_id, e.attempt) for e in done)
                sends += len(chunk) - len(failed)
                duplicates += result.duplicates
                foreign_hashes += len(result.foreign)
                foreign.note(result.foreign, "dispatcher (sent ahead)")
        return sends, duplicates, foreign_hashes

    def mark(self, total) -> int:
        """Mark what was sent in one statement (store.MARK_AHEAD_SQL), counted in ``total`` (the drain's
        DrainResult) as dispatched, and as claimed if this drain sent it (``count_fresh``); what it could not mark
        (a peer's lease, a pause) is left to the claim."""
        if not self.sent:
            return 0
        marked = store.mark_ahead(self.sent, total.latencies)
        attempts = [(envelope_id, self.sent.pop(envelope_id)[0]) for envelope_id in marked]
        self._first_at = self.clock() if self.sent else None
        self.remember(attempts)
        fresh = self.fresh
        self.count_claimed(total, [(i, a) for i, a in attempts if fresh.pop(i, None) == a])
        total.dispatched += len(marked)
        total.sent_ahead += len(marked)
        return len(marked)

    def count_fresh(self, total) -> None:
        """This drain's sends, left to a later mark, count as claimed here: the arming (dispatch.arming) reads
        how much work each drain took, not when its marks were written."""
        self.count_claimed(total, list(self.fresh.items()))
        self.fresh = {}

    @staticmethod
    def count_claimed(total, attempts: list[tuple[int, int]]) -> None:
        total.claimed += len(attempts)
        total.claimed_first += sum(1 for _, attempt in attempts if attempt == 1)

    def claimed(self, sendable: list[Claimed]) -> tuple[list[Claimed], dict[int, float]]:
        """Split a claim's envelopes: those still to send, and those sent ahead (id -> send start), forgotten here."""
        done: dict[int, float] = {}
        if self.sent:
            for envelope in sendable:
                sent = self.sent.get(envelope.envelope_id)
                if sent is not None and sent[0] == envelope.attempt:
                    done[envelope.envelope_id] = sent[1]
                    del self.sent[envelope.envelope_id]
        return ([e for e in sendable if e.envelope_id not in done] if done else sendable), done

    def remember(self, claims: list[tuple[int, int]]) -> None:
        """(envelope id, attempt) this loop claimed, or marked after its send ahead."""
        recent = self.recent
        recent.update(claims)
        while len(recent) > MAX_REMEMBERED_CLAIMS:
            recent.popitem(last=False)

    def _failed(self, server: str, exc: BaseException) -> None:
        reason = outage_reason(exc)
        error = f"{type(exc).__name__}: {exc}"
        if reason is None:
            log.info(
                "announced envelopes not sent ahead of their claim (%s); the claim sends them",
                error,
                extra={"action": "send_ahead_failed", "domain": "dispatch"},
            )
            return
        # Redis as a whole refuses: the breaker pauses dispatch now rather than after the claim's send times out.
        self.breaker_for(server).failed(reason, error)
        log.warning(
            "dispatch paused: %s (%s) on %s; its envelopes wait for the probe, uncounted",
            reason,
            error,
            redis_servers.label(server),
            extra={"action": "dispatch_paused", "domain": "dispatch"},
        )
