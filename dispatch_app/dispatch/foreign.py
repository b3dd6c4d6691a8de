"""Sends that found a hash at their RQ id that this deployment's dispatcher did not write: said, never silent.

``publisher.CREATE_IF_ABSENT`` replaces such a hash and pushes the job (``SendResult.foreign``); before, a planted
hash made the send a silent "already there" and the job waited for recovery. Each one is logged (action
``foreign_hash_replaced``) and put on its job's timeline (event ``foreign_hash_replaced``); the dispatch loop counts
them in its drain (``DrainResult.foreign``, metric ``productflow_rq_foreign_hashes_replaced_total``).
"""

from __future__ import annotations

import logging

import dispatch_app.rq.ids as ids
import dispatch_app.store.api as store
from dispatch_app.store.api import Claimed

log = logging.getLogger("dispatch_app.dispatch")

KIND = "foreign_hash_replaced"
REASON = (
    "the RQ job hash at this attempt's id was not written by this deployment's dispatcher (no valid signature: "
    "planted, or left by another deployment or a recreated database); it was replaced and the job sent"
)


def note(envelopes: list[Claimed], where: str) -> None:
    """Log and record the foreign hashes a send replaced; never raises (the send itself succeeded)."""
    if not envelopes:
        return
    shown = ", ".join(ids.rq_job_id(e.job_id, e.attempt) for e in envelopes[:10])
    log.warning(
        "%s: %d send(s) found a job hash this deployment did not write at their RQ id and replaced it: %s%s",
        where,
        len(envelopes),
        shown,
        " ..." if len(envelopes) > 10 else "",
        extra={"action": KIND, "domain": envelopes[0].domain},
    )
    try:
        store.record_many(
            {"job_id": e.job_id, "attempt": e.attempt, "kind": KIND, "reason": REASON, "data": {"sender": where}}
            for e in envelopes
        )
    except Exception as exc:  # noqa: BLE001 - the timeline row is a note; the jobs were sent
        log.warning(
            "could not record %d %s event(s): %s: %s",
            len(envelopes),
            KIND,
            type(exc).__name__,
            str(exc)[:200],
            extra={"action": "foreign_hash_event_failed", "domain": envelopes[0].domain},
        )
