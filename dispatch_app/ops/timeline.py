"""A job's timeline: submitted -> each envelope attempt -> dispatched -> started -> finished, with its events.

Durations are differences of database timestamps; an unfinished stage is
measured up to the database's clock_timestamp() read in the same query.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dispatch_app.dbtime import db_now
from dispatch_app.models import DispatchEnvelope, Job, JobEvent

STAGE_BY_STATUS = {"submitted": "outbox", "queued": "RQ queue", "running": "worker"}


def waiting_stage(status: str) -> str:
    return STAGE_BY_STATUS.get(status, "finished")


@dataclass
class Entry:
    at: datetime
    kind: str  # stage | envelope | event
    label: str
    detail: str = ""
    reason: str = ""
    attempt: int | None = None
    until_next: timedelta | None = None


@dataclass
class Stage:
    name: str
    start: datetime | None
    end: datetime | None
    duration: timedelta | None
    ongoing: bool = False


@dataclass
class Timeline:
    job: Job
    now: datetime
    stage: str
    entries: list[Entry] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    envelopes: list[DispatchEnvelope] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)


def build(job_id: int) -> Timeline:
    job = Job.objects.get(pk=job_id)
    now = db_now()
    envelopes = list(DispatchEnvelope.objects.filter(job_id=job_id).order_by("attempt"))
    events = list(JobEvent.objects.filter(job_id=job_id).order_by("at", "id"))
    entries = [Entry(job.submitted_at, "stage", "submitted", attempt=1)]
    for env in envelopes:
        entries.append(
            Entry(
                env.created_at,
                "envelope",
                f"attempt {env.attempt}: envelope created",
                detail=f"queue {env.queue}, {env.status}, {env.send_attempts} send attempt(s)",
                reason=env.last_error,
                attempt=env.attempt,
            )
        )
        if env.dispatched_at is not None:
            entries.append(
                Entry(env.dispatched_at, "envelope", f"attempt {env.attempt}: dispatched to RQ", attempt=env.attempt)
            )
    if job.dispatched_at is not None:
        entries.append(Entry(job.dispatched_at, "stage", "dispatched (first)"))
    if job.started_at is not None:
        entries.append(Entry(job.started_at, "stage", f"started (attempt {job.attempt})", attempt=job.attempt))
    if job.finished_at is not None:
        entries.append(Entry(job.finished_at, "stage", f"finished: {job.status}", reason=job.error))
    for event in events:
        entries.append(
            Entry(event.at, "event", event.kind, detail=_data(event.data), reason=event.reason, attempt=event.attempt)
        )
    entries.sort(key=lambda e: e.at)
    for current, following in zip(entries, entries[1:], strict=False):
        current.until_next = following.at - current.at
    if entries and job.finished_at is None:
        entries[-1].until_next = now - entries[-1].at

    def stage(name, start, end):
        if start is None:
            return Stage(name, None, None, None)
        ongoing = end is None
        if ongoing and job.finished_at is not None:
            return Stage(name, start, None, None)  # skipped (e.g. cancelled before it started)
        return Stage(name, start, end, (end or now) - start, ongoing)

    stages = [
        stage("outbox (submitted → dispatched)", job.submitted_at, job.dispatched_at),
        stage("RQ queue (dispatched → started)", job.dispatched_at, job.started_at),
        stage("worker (started → finished)", job.started_at, job.finished_at),
    ]
    return Timeline(job, now, waiting_stage(job.status), entries, stages, envelopes, events)


def _data(data) -> str:
    if not data:
        return ""
    return ", ".join(f"{k}={v}" for k, v in data.items()) if isinstance(data, dict) else str(data)


def format_duration(value: timedelta | float | None) -> str:
    if value is None:
        return "–"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
