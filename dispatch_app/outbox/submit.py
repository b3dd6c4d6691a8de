"""The outbox write: a job and its dispatch envelope in one transaction.

Nothing here talks to Redis; the dispatcher moves envelopes later. Inside a
caller's transaction the caller's rollback removes both rows, and the NOTIFY
the envelope trigger emits is delivered only on commit.

The write is one SQL statement (``store.jobs``; data-modifying CTEs: the jobs, then their
envelopes), so on its own it is one transaction in one round trip: no BEGIN,
no COMMIT, no savepoint, no ORM compile. It cost 2.35 ms of client CPU per
submit through ``bulk_create`` in ``atomic()`` against 0.48 ms for two plain
INSERTs in a transaction (docs/benchmarks.md, "submit cost"). Validation stays
complete and runs before anything is sent. Inside the caller's transaction it
is one statement of that transaction, with no savepoint of its own: a
database error there aborts the caller's transaction, as any failed statement does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Protocol

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

import dispatch_app.db.prepared as prepared
import dispatch_app.outbox.payloads as payloads
import dispatch_app.store.api as store
import dispatch_app.timeline.tracing as tracing
from dispatch_app.config.settings import cached_settings
from dispatch_app.config.tuning import ANNOUNCE_MAX_ROWS
from dispatch_app.domains import PayloadError, UnknownDomain, domain_keys, get_domain
from dispatch_app.models import Job, JobStatus
from dispatch_app.store.api import redispatch


@dataclass(frozen=True)
class JobSpec:
    domain: str
    payload: dict
    available_at: datetime | timedelta | None = None


# How far from now ``available_at`` may be, either way (a datetime, or a timedelta on the database clock).
# Farther is a mistake (``timedelta.max`` overflowed the database's interval: a DataError); README documents it.
AVAILABLE_AT_MAX_SECONDS = 366 * 86_400


def _check_available_at(available_at: Any, where: str) -> None:
    if available_at is None:
        return
    if not isinstance(available_at, (datetime, timedelta)):
        raise ValidationError(
            f"{where}available_at must be a datetime or a timedelta, got {type(available_at).__name__}",
            code="invalid_available_at",
        )
    if isinstance(available_at, datetime) and available_at.tzinfo is None:
        raise ValidationError(f"{where}available_at must be timezone-aware", code="invalid_available_at")
    try:
        ahead = available_at if isinstance(available_at, timedelta) else available_at - timezone.now()
        far = abs(ahead.total_seconds()) > AVAILABLE_AT_MAX_SECONDS
    except OverflowError:
        far = True
    if far:
        raise ValidationError(
            f"{where}available_at must be within {AVAILABLE_AT_MAX_SECONDS // 86_400} days of now, got {available_at}",
            code="invalid_available_at",
        )


def _spec(spec: Any, where: str) -> JobSpec:
    """A JobSpec, or a (domain, payload[, available_at]) tuple or list made one; anything else is refused."""
    if isinstance(spec, JobSpec):
        return spec
    if isinstance(spec, (tuple, list)) and 2 <= len(spec) <= 3:
        return JobSpec(*spec)
    raise ValidationError(
        f"{where}a job spec is a JobSpec or a (domain, payload[, available_at]) tuple, got {type(spec).__name__}"
        + (f" of {len(spec)}" if isinstance(spec, (tuple, list)) else ""),
        code="malformed_spec",
    )


def _validated(domain_key: Any, payload: Any, available_at: Any, max_bytes: int, where: str = "") -> str:
    """The payload's JSON text, or a ValidationError naming what is wrong."""
    if not isinstance(domain_key, str):
        # A bounded repr (a deeply nested value's own repr recurses until it fails, a long one is echoed whole).
        raise ValidationError(
            f"{where}unknown domain {payloads.shown(domain_key)}: not a string ({type(domain_key).__name__})",
            code="unknown_domain",
        )
    try:
        domain = get_domain(domain_key)
    except UnknownDomain:
        # Cut: the name is the caller's (a 1 MB one was echoed whole).
        raise ValidationError(
            f"{where}unknown domain {payloads.shown(domain_key)}; valid domains: {', '.join(domain_keys())}",
            code="unknown_domain",
        ) from None
    # Before encoding: what jsonb would refuse (a DataError that aborts the caller's transaction), nesting the
    # encoder would recurse into, and the size: lengths are compared with the limit before items are read, so an
    # oversized payload is refused in time and memory bounded by the limit, not by the payload.
    payloads.check(payload, f"{where}payload", max_bytes=max_bytes)
    try:
        encoded = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"{where}{domain.key}: payload is not JSON-serialisable ({exc})", code="not_json"
        ) from None
    size = len(encoded.encode())
    if size > max_bytes:
        raise ValidationError(
            f"{where}{domain.key}: payload is {size} bytes, over the limit of {max_bytes} "
            "(DISPATCH['PAYLOAD_MAX_BYTES'])",
            code="payload_too_large",
        )
    try:
        domain.validate(payload)
    except PayloadError as exc:
        raise ValidationError(f"{where}{exc}", code="invalid_payload") from None
    _check_available_at(available_at, where)
    return encoded


class WriterSend(Protocol):
    def ready(self) -> bool: ...
    def send(self, rows: list[tuple[int, int, int, str, str]]) -> int: ...


# The writer's own send (DISPATCH['SUBMIT_SENDS']), installed by the app (dispatch_app.dispatch.writer_send):
# this layer may not import the dispatcher's. None: every envelope is the dispatcher's to send.
_writer_send: WriterSend | None = None


def install_writer_send(sender: WriterSend | None) -> WriterSend | None:
    """Use ``sender`` for the envelopes a submit sends itself; returns the one it replaces."""
    global _writer_send
    previous, _writer_send = _writer_send, sender
    return previous


def submit(domain: str, payload: dict, *, available_at: datetime | timedelta | None = None) -> Job:
    """Validate, then write the job and its first envelope in one transaction.

    Raises ``ValidationError`` naming the problem; nothing is written then.
    """
    return submit_many([JobSpec(domain, payload, available_at)])[0]


def submit_many(specs: Iterable[JobSpec | tuple]) -> list[Job]:
    """The bulk variant: every spec is validated before anything is written."""
    max_bytes = cached_settings().PAYLOAD_MAX_BYTES
    if isinstance(specs, (str, bytes, dict, JobSpec)) or not isinstance(specs, Iterable):
        raise ValidationError(
            f"submit_many takes a list of job specs, got {type(specs).__name__}", code="malformed_spec"
        )
    specs = list(specs)
    many = len(specs) > 1
    specs = [_spec(s, f"jobs[{i}]: " if many else "") for i, s in enumerate(specs)]
    encoded = [
        _validated(s.domain, s.payload, s.available_at, max_bytes, f"jobs[{i}]: " if many else "")
        for i, s in enumerate(specs)
    ]
    if not specs:
        return []
    sql, defaults, returned = store.create_statement()
    sender = _writer_send
    # A small submit only: a bulk one is the dispatcher's (its batches send faster than one writer's chunk).
    writes_own = sender is not None and len(specs) <= ANNOUNCE_MAX_ROWS and sender.ready()
    trace = tracing.capture()  # the caller's trace context, one parameter of the same statement (timeline.tracing)
    at = [s.available_at if isinstance(s.available_at, datetime) else None for s in specs]
    delay = [s.available_at.total_seconds() if isinstance(s.available_at, timedelta) else None for s in specs]
    params = [
        [s.domain for s in specs],
        encoded,
        [get_domain(s.domain).queue for s in specs],
        at,
        delay,
        json.dumps(trace) if trace else None,
        *defaults,
        writes_own,
    ]
    with prepared.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    jobs, own = [], []
    for spec, row in zip(specs, rows, strict=True):
        job = Job(domain=spec.domain, payload=spec.payload, trace_context=trace)
        job.id = row[0]
        for name, value in zip(returned, row[1:-2], strict=True):
            setattr(job, name, value)
        job._state.adding = False
        job._state.db = connection.alias
        jobs.append(job)
        if row[-1]:
            own.append((row[-2], job.id, 1, spec.domain, get_domain(spec.domain).queue))
    if own:
        # After the commit: at once outside a transaction, never if the caller's rolls back.
        transaction.on_commit(partial(sender.send, own))
    return jobs


__all__ = ["JobSpec", "JobStatus", "install_writer_send", "redispatch", "submit", "submit_many"]
