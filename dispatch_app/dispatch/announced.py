"""Envelopes a writer announced in its NOTIFY, sent to RQ before they are claimed.

A small insert (a submit, a worker's retry: at most ANNOUNCE_MAX_ROWS envelopes,
claimable now, of a domain not paused) names its envelopes in the payload
(``models._NOTIFY_INSERTED``). The listener hands them to the dispatch loop with
its wake; the loop sends them at once and then claims and marks them as usual,
without sending them again. The claim's round trip, about a third of the
dispatcher's hop, is then off the job's path from commit to start.

The table stays the record: an announcement is only a head start. A lost or
unreadable one is found by the claim that follows every wake. Sending before the
claim is safe because a send is idempotent (RQ's create-if-absent script leaves
an existing job alone, and the worker's start compare-and-set refuses a second
start of an attempt): several dispatchers hearing the same NOTIFY, or a claim
that finds the envelope taken by a peer, cost a duplicate send, never a second
run. ``DISPATCH["SEND_ANNOUNCED"] = False`` claims first, as before.
"""

from __future__ import annotations

import json
from collections import deque

from dispatch_app.conf import ANNOUNCE_PREFIX
from dispatch_app.dispatch.claim import Claimed

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
