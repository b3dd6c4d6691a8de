"""A job's timeline: each attempt with its own stages (dispatch_app.timeline.stages), its envelope and its events.

Nothing here computes a stage time: ``stages.Attempt`` does, per attempt, so a re-dispatch never stretches
a stage across attempts and an earlier attempt's rows stay as they were. Durations are differences of
database timestamps; an unfinished stage is measured up to the database clock read with the page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import dispatch_app.timeline.stages as st
from dispatch_app.db.clock import db_now
from dispatch_app.models import DispatchEnvelope, DomainPauseEvent, Job, JobEvent

STAGE_BY_STATUS = {"submitted": "outbox", "queued": "RQ queue", "running": "worker"}


def waiting_stage(status: str) -> str:
    """The stage a status implies, without the attempt's times (a backoff reads as "outbox" here)."""
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
class AttemptView:
    attempt: st.Attempt
    stages: list[tuple[st.Stage, str]]  # (stage, formatted duration)
    envelope: DispatchEnvelope | None
    error_class: str
    error_message: str
    traceback: str
    ended_by: str  # for a superseded attempt: the event that replaced it, with its reason
    current: bool
    # Time its domain was paused while this attempt waited in the outbox (part of the outbox stage, shown as its
    # own stage: the dispatcher could not have sent it), and the formatted duration.
    paused: timedelta | None = None
    paused_text: str = ""


@dataclass
class Timeline:
    job: Job
    now: datetime
    stage: str
    entries: list[Entry] = field(default_factory=list)
    stages: list[st.Stage] = field(default_factory=list)  # the current attempt's
    envelopes: list[DispatchEnvelope] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)
    attempts: list[AttemptView] = field(default_factory=list)  # newest first


def pause_intervals(domain: str, since: datetime, now: datetime) -> tuple[list, list[DomainPauseEvent]]:
    """The domain's paused intervals [(start, end)] overlapping [since, now] and the pause/resume events in it
    (DomainPauseEvent; a pause still on ends at ``now``)."""
    before = DomainPauseEvent.objects.filter(domain=domain, at__lt=since).order_by("-at", "-id").first()
    events = list(DomainPauseEvent.objects.filter(domain=domain, at__gte=since, at__lte=now).order_by("at", "id"))
    intervals, start = [], (since if before is not None and before.op == "pause" else None)
    for event in events:
        if event.op == "pause" and start is None:
            start = event.at
        elif event.op == "resume" and start is not None:
            intervals.append((start, event.at))
            start = None
    if start is not None:
        intervals.append((start, now))
    return intervals, events


def overlap(intervals, start: datetime | None, end: datetime | None) -> timedelta | None:
    if start is None or end is None:
        return None
    total = sum((max(min(e, end) - max(s, start), timedelta(0)) for s, e in intervals), timedelta(0))
    return total or None


def _paused_in_outbox(attempt: st.Attempt, intervals, now: datetime) -> timedelta | None:
    outbox = next((s for s in attempt.stages(now) if s.key == "outbox"), None)
    if outbox is None or outbox.start is None:
        return None
    return overlap(intervals, outbox.start, outbox.end or now)


def build(job_id: int) -> Timeline:
    job = Job.objects.get(pk=job_id)
    now = db_now()
    envelopes = list(DispatchEnvelope.objects.filter(job_id=job_id).order_by("attempt"))
    events = list(JobEvent.objects.filter(job_id=job_id).order_by("at", "id"))
    attempts = st.job_attempts(job, envelopes)
    intervals, pauses = pause_intervals(job.domain, job.submitted_at, job.finished_at or now)
    by_attempt = {env.attempt: env for env in envelopes}
    entries: list[Entry] = []
    views: list[AttemptView] = []
    for attempt in attempts:
        env = by_attempt.get(attempt.attempt)
        entries += _attempt_entries(attempt, env, now)
        views.append(_attempt_view(job, attempt, env, events, intervals, now))
    for event in events:
        entries.append(
            Entry(event.at, "event", event.kind, detail=_data(event.data), reason=event.reason, attempt=event.attempt)
        )
    for pause in pauses:
        # The attempt it happened in: the latest one created before it.
        n = max((a.attempt for a in attempts if a.created_at <= pause.at), default=attempts[0].attempt)
        label = f"dispatch of {job.domain} {'paused' if pause.op == 'pause' else 'resumed'}"
        reason = f"by {pause.actor or 'system'}" + (f": {pause.reason}" if pause.reason else "")
        entries.append(Entry(pause.at, "pause", label, reason=reason, attempt=n))
    # By attempt, then time: an attempt's last event (its retry decision) comes before the next attempt's rows
    # even when the next envelope was written in the same instant.
    entries.sort(key=lambda e: (e.attempt or 0, e.at))
    for current, following in zip(entries, entries[1:], strict=False):
        current.until_next = following.at - current.at if following.at >= current.at else None
    if entries and job.finished_at is None:
        entries[-1].until_next = now - entries[-1].at
    current = attempts[-1]
    stage_key = current.waiting_in(now)
    return Timeline(
        job=job,
        now=now,
        stage=st.SHORT.get(stage_key, stage_key),
        entries=entries,
        stages=current.stages(now),
        envelopes=envelopes,
        events=events,
        attempts=list(reversed(views)),
    )


def _attempt_view(job: Job, attempt: st.Attempt, env, events: list, intervals, now: datetime) -> AttemptView:
    """One attempt's panel: its stages, its envelope, its error, what ended it, the outbox wait a pause took."""
    n = attempt.attempt
    error_class, message, trace = attempt.error_parts()
    replaced = (
        next((e for e in events if e.attempt == n and (e.data or {}).get("next_attempt") == n + 1), None)
        if attempt.outcome == "superseded"
        else None
    )
    view = AttemptView(
        attempt=attempt,
        stages=[(s, format_duration(s.duration)) for s in attempt.stages(now)],
        envelope=env,
        error_class=error_class,
        error_message=message,
        traceback=trace,
        ended_by=f"{replaced.kind}: {replaced.reason}" if replaced else "",
        current=n == job.attempt,
    )
    paused = _paused_in_outbox(attempt, intervals, now)
    view.paused, view.paused_text = paused, format_duration(paused) if paused else ""
    return view


def _attempt_entries(attempt: st.Attempt, env: DispatchEnvelope | None, now: datetime) -> list[Entry]:
    n = attempt.attempt
    out = [Entry(attempt.created_at, "stage", "submitted" if n == 1 else f"attempt {n}: created", attempt=n)]
    if env is not None:
        out.append(
            Entry(
                env.created_at,
                "envelope",
                f"attempt {n}: envelope created",
                detail=f"queue {env.queue}, {env.status}, {env.send_attempts} send attempt(s)",
                reason=env.last_error,
                attempt=n,
            )
        )
    due = attempt.due()
    if attempt.due_at is not None and due > attempt.created_at and due <= now:
        # Created with a delay: a scheduled submit, a retry's backoff, or a recovery round's spread (not told apart
        # by the attempt row; the events beside it say which).
        out.append(Entry(due, "stage", f"attempt {n}: due (its delay is over)", attempt=n))
    if attempt.dispatched_at is not None:
        out.append(Entry(attempt.dispatched_at, "stage", f"attempt {n}: dispatched to RQ", attempt=n))
    if attempt.started_at is not None:
        worker = f" on {attempt.worker}" if attempt.worker else ""
        out.append(Entry(attempt.started_at, "stage", f"attempt {n}: started{worker}", attempt=n))
    if attempt.finished_at is not None:
        error_class, message, _ = attempt.error_parts()
        reason = f"{error_class}: {message}" if error_class else message
        label = (
            f"attempt {n}: superseded by attempt {n + 1}"
            if attempt.outcome == "superseded"
            else (f"attempt {n}: finished: {attempt.outcome}")
        )
        out.append(Entry(attempt.finished_at, "stage", label, reason=reason, attempt=n))
    return out


def _data(data) -> str:
    if not data:
        return ""
    return ", ".join(f"{k}={v}" for k, v in data.items()) if isinstance(data, dict) else str(data)


def format_duration(value: timedelta | float | None) -> str:
    """A duration for people; anything that is not one ("" from a template's missing key, None) reads "–":
    the pages show what is unknown, they never fail on it."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif value is None or isinstance(value, (str, bool)):
        return "–"
    else:
        try:
            seconds = float(value)  # int, float, Decimal
        except (TypeError, ValueError):
            return "–"
    if not math.isfinite(seconds):
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
