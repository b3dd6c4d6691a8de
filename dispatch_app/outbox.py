"""The outbox write: a job and its dispatch envelope in one transaction.

Nothing here talks to Redis; the dispatcher moves envelopes later. Inside a
caller's transaction the caller's rollback removes both rows, and the NOTIFY
the envelope trigger emits is delivered only on commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, Value

from dispatch_app.conf import dispatch_settings
from dispatch_app.dbtime import ClockTimestamp
from dispatch_app.domains import PayloadError, UnknownDomain, get_domain
from dispatch_app.models import DispatchEnvelope, Job, JobEvent, JobStatus


@dataclass(frozen=True)
class JobSpec:
    domain: str
    payload: dict
    available_at: datetime | timedelta | None = None


def _validated(domain_key: Any, payload: Any, available_at: Any, max_bytes: int, where: str = "") -> dict:
    try:
        domain = get_domain(domain_key)
    except UnknownDomain as exc:
        raise ValidationError(f"{where}{exc}", code="unknown_domain") from None
    try:
        encoded = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"{where}{domain.key}: payload is not JSON-serialisable ({exc})", code="not_json"
        ) from None
    if len(encoded.encode()) > max_bytes:
        raise ValidationError(
            f"{where}{domain.key}: payload is {len(encoded.encode())} bytes, over the limit of {max_bytes} "
            "(DISPATCH['PAYLOAD_MAX_BYTES'])",
            code="payload_too_large",
        )
    try:
        domain.validate(payload)
    except PayloadError as exc:
        raise ValidationError(f"{where}{exc}", code="invalid_payload") from None
    if available_at is not None and not isinstance(available_at, (datetime, timedelta)):
        raise ValidationError(
            f"{where}available_at must be a datetime or a timedelta, got {type(available_at).__name__}"
        )
    if isinstance(available_at, datetime) and available_at.tzinfo is None:
        raise ValidationError(f"{where}available_at must be timezone-aware")
    return payload


def _available_at_sql(value: datetime | timedelta | None):
    """A delay is added to the database clock, never to the host's."""
    if isinstance(value, timedelta):
        return ExpressionWrapper(
            ClockTimestamp() + Value(value, output_field=DurationField()), output_field=DateTimeField()
        )
    return value


def submit(domain: str, payload: dict, *, available_at: datetime | timedelta | None = None) -> Job:
    """Validate, then write the job and its first envelope in one transaction.

    Raises ``ValidationError`` naming the problem; nothing is written then.
    """
    return submit_many([JobSpec(domain, payload, available_at)])[0]


def submit_many(specs: Iterable[JobSpec | tuple]) -> list[Job]:
    """The bulk variant: every spec is validated before anything is written."""
    conf = dispatch_settings()
    specs = [s if isinstance(s, JobSpec) else JobSpec(*s) for s in specs]
    for index, spec in enumerate(specs):
        where = f"jobs[{index}]: " if len(specs) > 1 else ""
        _validated(spec.domain, spec.payload, spec.available_at, conf.PAYLOAD_MAX_BYTES, where)
    if not specs:
        return []
    with transaction.atomic():
        jobs = Job.objects.bulk_create([Job(domain=s.domain, payload=s.payload) for s in specs])
        envelopes = []
        for job, spec in zip(jobs, specs, strict=True):
            envelope = DispatchEnvelope(job=job, attempt=1, domain=spec.domain, queue=get_domain(spec.domain).queue)
            if spec.available_at is not None:
                envelope.available_at = _available_at_sql(spec.available_at)
            envelopes.append(envelope)
        DispatchEnvelope.objects.bulk_create(envelopes)
    return jobs


def redispatch(
    job_id: int,
    from_attempt: int,
    *,
    kind: str,
    reason: str,
    delay_seconds: float = 0.0,
    allowed_statuses: tuple[str, ...] = ("submitted", "queued", "running"),
) -> int | None:
    """Start the next attempt of a job through the outbox (new envelope, NOTIFY on commit).

    Compare-and-set on (attempt, status): returns the new attempt, or None when
    the job has moved on since the caller looked. Must run inside a transaction.
    """
    assert connection.in_atomic_block, "redispatch must run inside the caller's transaction"
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_app_job SET attempt = attempt + 1, status = 'submitted', error = '', "
            "vendor_request_id = '', started_at = NULL "
            "WHERE id = %s AND attempt = %s AND status = ANY(%s) RETURNING attempt, domain",
            [job_id, from_attempt, list(allowed_statuses)],
        )
        row = cursor.fetchone()
        if row is None:
            return None
        attempt, domain_key = row
        queue = get_domain(domain_key).queue
        cursor.execute(
            "INSERT INTO dispatch_app_dispatchenvelope "
            "(job_id, attempt, domain, queue, status, available_at, send_attempts, last_error, created_at) "
            "VALUES (%s, %s, %s, %s, 'pending', "
            "clock_timestamp() + make_interval(secs => %s), 0, '', clock_timestamp())",
            [job_id, attempt, domain_key, queue, delay_seconds],
        )
    JobEvent.objects.create(
        job_id=job_id,
        attempt=from_attempt,
        kind=kind,
        reason=reason,
        data={"next_attempt": attempt, "delay_seconds": delay_seconds},
    )
    return attempt


__all__ = ["JobSpec", "JobStatus", "redispatch", "submit", "submit_many"]
