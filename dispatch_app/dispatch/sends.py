"""One batch's sends, grouped by Redis server, and what they did.

Each domain's queue lives on the server its ``RQ_QUEUES`` entry names, so a
batch is split into chunks per server, the servers taken in turn (one slow
server does not go first). A paused server's envelopes are given back unsent
and uncounted; once one chunk finds its server refusing, that server's chunks
not yet started are not sent. ``BatchRecord`` collects what the sends did, for
the loop to write (marks, backoffs, dead letters, give-backs).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

import dispatch_app.dispatch.foreign as foreign
import dispatch_app.rq.servers as redis_servers
from dispatch_app.config.tuning import MIN_PROBE_BACKOFF
from dispatch_app.dispatch.breaker import OPEN, outage_reason
from dispatch_app.store.api import Claimed

log = logging.getLogger("dispatch_app.dispatch")


NOT_SENT = object()  # a chunk's value when its server refused an earlier chunk of the batch


@dataclass
class BatchRecord:
    """What the sends of one batch did, waiting to be written."""

    token: uuid.UUID
    sent_ids: list[int] = field(default_factory=list)
    skipped_ids: list[int] = field(default_factory=list)
    failures: dict[str, list[int]] = field(default_factory=dict)
    permanent: list[tuple[Claimed, str]] = field(default_factory=list)
    # Per server: envelopes given back uncounted because that server refused (or is paused), why, and for how long.
    outage_ids: dict[str, list[int]] = field(default_factory=dict)
    outage_error: dict[str, str] = field(default_factory=dict)
    outage_reason: dict[str, str] = field(default_factory=dict)
    outage_delay: dict[str, float] = field(default_factory=dict)
    # Servers whose sends this batch reached (a reply came back): their breakers close.
    answered: set[str] = field(default_factory=set)
    # Envelope id -> time.monotonic() when its send started: the mark dates the dispatch from it.
    send_started: dict[int, float] = field(default_factory=dict)


class Halt:
    """The sender's stop for one batch: the loop's stop signal, or a Redis server refusing as a whole.

    Once one chunk finds its server refusing (or hanging until the timeout), the
    batch's chunks for that server not yet started are not sent: each would wait
    out the same refusal, and the lease must only cover one wave of them. The
    other servers' chunks go on.
    """

    def __init__(self, stop: threading.Event, server_of, started: dict[int, float] | None = None):
        self.stop = stop
        self.server_of = server_of
        self.refused: set[str] = set()  # set.add is atomic under the GIL; read by the send threads
        self.started = {} if started is None else started  # BatchRecord.send_started (dict.update: atomic)

    def is_set(self) -> bool:
        return self.stop.is_set()

    def watching(self, send):
        def watched(chunk):
            server = self.server_of(chunk[0].queue)
            if server in self.refused:
                return NOT_SENT
            self.started.update(dict.fromkeys((e.envelope_id for e in chunk), time.monotonic()))
            try:
                return send(chunk)
            except Exception as exc:
                if outage_reason(exc) is not None:
                    self.refused.add(server)
                raise

        return watched


def chunks(sendable: list[Claimed], record: BatchRecord, *, server_of, breaker_for, size: int) -> list[list[Claimed]]:
    """The batch's chunks, each for one server, servers taken in turn (one slow server does not go first).

    A paused server's envelopes are given back uncounted until its probe is
    due; a probing server gets one envelope, the rest come back at once.
    """
    groups: dict[str, list[Claimed]] = {}
    for envelope in sendable:
        groups.setdefault(server_of(envelope.queue), []).append(envelope)
    per_server: list[list[list[Claimed]]] = []
    for server, envelopes in groups.items():
        breaker = breaker_for(server)
        if breaker.state == OPEN:
            hold(record, server, envelopes, max(breaker.seconds_to_probe() or 0.0, MIN_PROBE_BACKOFF))
            continue
        if breaker.probing and len(envelopes) > 1:
            hold(record, server, envelopes[1:], 0.0)
            envelopes = envelopes[:1]
        per_server.append([envelopes[i : i + size] for i in range(0, len(envelopes), size)])
    result: list[list[Claimed]] = []
    for wave in range(max((len(c) for c in per_server), default=0)):
        result.extend(c[wave] for c in per_server if wave < len(c))
    return result


def hold(record: BatchRecord, server: str, envelopes: list[Claimed], delay: float) -> None:
    """Given back unsent and uncounted: their server is paused (its breaker has the reason)."""
    key = f"held:{server}"
    record.outage_ids.setdefault(key, []).extend(e.envelope_id for e in envelopes)
    record.outage_delay[key] = delay


def envelope_failed(record: BatchRecord, ids: list[int], exc: BaseException) -> None:
    """An error of these envelopes' own: it counts toward their MAX_SEND_ATTEMPTS."""
    error = f"{type(exc).__name__}: {exc}"
    record.failures.setdefault(error, []).extend(ids)
    log.warning(
        "send failed for %d envelopes: %s", len(ids), error, extra={"action": "send_failed", "domain": "dispatch"}
    )


def sort_outcomes(outcomes, record: BatchRecord, result, server_of) -> None:
    """File each chunk's outcome in the record: sent, skipped (stopping), failed, or given back (server refusing).

    ``result`` (the loop's DrainResult) gets the duplicates and the first outage reason.
    """
    for outcome in outcomes:
        ids = [e.envelope_id for e in outcome.item]
        server = server_of(outcome.item[0].queue)
        if outcome.skipped:
            record.skipped_ids.extend(ids)
        elif outcome.ok and outcome.value is NOT_SENT:
            # Never sent: an earlier chunk found this server refusing. Given back with the batch, uncounted.
            record.outage_ids.setdefault(server, []).extend(ids)
        elif outcome.ok:
            record.answered.add(server)
            failed = outcome.value.failed
            bad = {e.envelope_id for e, _ in failed}
            record.sent_ids.extend(i for i in ids if i not in bad)
            result.sends += len(ids) - len(bad)
            result.duplicates += outcome.value.duplicates
            if outcome.value.foreign:
                result.foreign += len(outcome.value.foreign)
                foreign.note(outcome.value.foreign, "dispatcher")
            for envelope, exc in failed:
                envelope_failed(record, [envelope.envelope_id], exc)
        else:
            reason = outage_reason(outcome.error)
            error = f"{type(outcome.error).__name__}: {outcome.error}"
            if reason is None:
                record.answered.add(server)
                envelope_failed(record, ids, outcome.error)
                continue
            record.outage_ids.setdefault(server, []).extend(ids)
            if server not in record.outage_reason:
                record.outage_reason[server], record.outage_error[server] = reason, error
                result.outage = result.outage or reason
    for server, reason in record.outage_reason.items():
        log.warning(
            "dispatch paused: %s (%s) on %s; %d envelopes given back uncounted",
            reason,
            record.outage_error[server],
            redis_servers.label(server),
            len(record.outage_ids.get(server, ())),
            extra={"action": "dispatch_paused", "domain": "dispatch"},
        )
