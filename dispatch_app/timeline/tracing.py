"""Tracing (optional): a job's timeline as OpenTelemetry spans in the trace of the request that submitted it.

``submit`` (and everything built on it, the ``django.tasks`` backend included) stores the caller's W3C trace
context on the job (``Job.trace_context``: ``{"traceparent": ..., "tracestate": ...}``) when it runs inside a
valid span. Later, each stage of each attempt becomes one span, a child of the submitting span:

  productflow.backoff      created → due          dispatcher, after its mark; only when the envelope was delayed
  productflow.outbox_wait  due → dispatched       dispatcher, after its mark
  productflow.queue_wait   dispatched → started   worker, when the run ends
  productflow.run          started → finished     worker; current while the domain's work runs, so spans the
                                                  work makes (an instrumented HTTP client...) are its children

Their start and end are the database's timestamps of that attempt (``JobAttempt``, the envelope, the job's
``started_at``), cut into stages by ``dispatch_app.timeline.stages``, the one definition the dashboard uses too: never a
host's clock. Attributes: ``productflow.job.id``, ``productflow.job.attempt``, ``productflow.job.domain``,
``productflow.stage``; the run adds ``productflow.job.outcome`` and ``productflow.worker``, and is an error
span when the attempt failed, ended outcome_unknown or was superseded (a retry, recovery's re-dispatch).

Costs. Without ``opentelemetry-api`` installed, or without a tracer provider configured (the API's default
proxy or a no-op provider), every hook returns after a check or two: no query, no allocation worth counting.
Capturing the context adds no statement and no round trip to the submit (it is one more parameter of its one
statement). With a tracer provider configured: the dispatcher reads its marked batch's traced envelopes in one
query per batch, traced or not (in its marker thread, off the send path), and the worker reads a traced
attempt's times in one query when its run ends. A job submitted outside any span (``trace_context`` NULL)
costs nothing more in the worker, with or without a provider. Sampling follows the submitting span (the
SDK's default ``ParentBased`` sampler): a request that was not sampled produces no job spans.

Tracing never fails a job or a dispatch: an error here is logged and the spans are dropped.
"""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import UTC, datetime

from django.db import connection

import dispatch_app.timeline.stages as stages
from dispatch_app.store.tables import ATTEMPT, ENVELOPE, JOB

try:  # The optional extra (requirements/tracing.txt): the project runs without it.
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:
    trace = None

log = logging.getLogger("dispatch_app.timeline.tracing")

AVAILABLE = trace is not None
INSTRUMENTATION = "dispatch_app"

ATTR_JOB_ID = "productflow.job.id"
ATTR_ATTEMPT = "productflow.job.attempt"
ATTR_DOMAIN = "productflow.job.domain"
ATTR_STAGE = "productflow.stage"
ATTR_OUTCOME = "productflow.job.outcome"
ATTR_WORKER = "productflow.worker"

SPAN_NAMES = {
    "backoff": "productflow.backoff",
    "outbox": "productflow.outbox_wait",
    "rq": "productflow.queue_wait",
    "worker": "productflow.run",
}

_PROPAGATOR = TraceContextTextMapPropagator() if AVAILABLE else None
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_override = None  # set_tracer_provider(): a provider for this module only (tests, apps without a global one)
_cached: tuple = (None, None)  # (provider, its tracer)
# The run span open in this worker (job_started → job_ended), and the token that made it current.
_open: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("productflow_run_span", default=None)


def set_tracer_provider(provider) -> None:
    """Use ``provider`` instead of OpenTelemetry's global one (``None``: back to the global)."""
    global _override
    _override = provider


def tracer():
    """The tracer, or None when nothing would record spans (no API, no provider configured: the no-op path)."""
    global _cached
    if trace is None:
        return None
    provider = _override or trace.get_tracer_provider()
    if isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider)):
        return None
    cached_provider, cached = _cached
    if cached_provider is not provider:
        cached = provider.get_tracer(INSTRUMENTATION)
        _cached = (provider, cached)
    return cached


def capture() -> dict | None:
    """The caller's W3C trace context, or None outside a valid span (or without the API)."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict = {}
    _PROPAGATOR.inject(carrier)
    return carrier


def _parent(trace_context):
    """An OpenTelemetry context whose span is the submitter's, or None for a missing or malformed value."""
    if isinstance(trace_context, str):  # jsonb read through a raw cursor
        trace_context = json.loads(trace_context)
    if not isinstance(trace_context, dict):
        return None
    context = _PROPAGATOR.extract(trace_context)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _ns(moment: datetime) -> int:
    """Nanoseconds since the epoch, in integers (a float loses the microseconds PostgreSQL keeps)."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _attributes(job_id: int, attempt: int, domain: str, stage: str) -> dict:
    return {ATTR_JOB_ID: job_id, ATTR_ATTEMPT: attempt, ATTR_DOMAIN: domain, ATTR_STAGE: stage}


def _emit(tracer_, stage: stages.Stage, parent, job_id: int, attempt: int, domain: str) -> None:
    """One finished span for a stage with a start and an end (an end before the start is clamped to it)."""
    end = max(stage.end, stage.start)
    span = tracer_.start_span(
        SPAN_NAMES[stage.key],
        context=parent,
        kind=SpanKind.INTERNAL,
        attributes=_attributes(job_id, attempt, domain, stage.key),
        start_time=_ns(stage.start),
    )
    span.end(end_time=_ns(end))


# --- dispatcher: the stages that end at the dispatch -------------------------------------------------------------

DISPATCHED_SQL = f"""
SELECT e.job_id, e.attempt, e.domain, j.trace_context, COALESCE(a.created_at, e.created_at), a.due_at,
       e.dispatched_at
FROM {ENVELOPE} e
JOIN {JOB} j ON j.id = e.job_id
LEFT JOIN {ATTEMPT} a ON a.job_id = e.job_id AND a.attempt = e.attempt
WHERE e.id = ANY(%s) AND e.status = 'dispatched' AND e.dispatched_at IS NOT NULL AND j.trace_context IS NOT NULL
"""


def envelopes_dispatched(envelope_ids: list[int]) -> None:
    """After the dispatcher's mark: the backoff and outbox-wait spans of the traced envelopes among these."""
    if not envelope_ids:
        return
    tracer_ = tracer()
    if tracer_ is None:
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute(DISPATCHED_SQL, [list(envelope_ids)])
            rows = cursor.fetchall()
        for job_id, attempt, domain, trace_context, created_at, due_at, dispatched_at in rows:
            parent = _parent(trace_context)
            if parent is None:
                continue
            timeline = stages.Attempt(attempt, created_at, due_at=due_at, dispatched_at=dispatched_at)
            for stage in timeline.stages(dispatched_at):
                if stage.key in ("backoff", "outbox") and stage.start is not None and stage.end is not None:
                    _emit(tracer_, stage, parent, job_id, attempt, domain)
    except Exception:  # spans are worth less than the dispatch they describe
        log.exception("tracing: the outbox spans of %d envelopes were dropped", len(envelope_ids))


# --- worker: the run (current while the work runs) and the queue wait before it ---------------------------------

ATTEMPT_SQL = f"""
SELECT a.created_at, a.due_at, COALESCE(a.dispatched_at, e.dispatched_at), a.started_at, a.finished_at,
       a.outcome, a.error, a.worker, clock_timestamp()
FROM {ATTEMPT} a
LEFT JOIN {ENVELOPE} e ON e.job_id = a.job_id AND e.attempt = a.attempt
WHERE a.job_id = %s AND a.attempt = %s
"""


def job_started(domain: str, job_id: int, attempt: int, trace_context, started_at: datetime) -> None:
    """After the worker's start: opens the run span (from the database's ``started_at``) and makes it current.

    ``trace_context`` and ``started_at`` are what the start statement returned. Closed by ``job_ended``.
    """
    if trace_context is None:
        return
    tracer_ = tracer()
    if tracer_ is None:
        return
    try:
        parent = _parent(trace_context)
        if parent is None:
            return
        span = tracer_.start_span(
            SPAN_NAMES["worker"],
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=_attributes(job_id, attempt, domain, "worker"),
            start_time=_ns(started_at),
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
    except Exception:
        log.exception("tracing: the run span of job %s attempt %s was not started", job_id, attempt)
        return
    _open.set((tracer_, span, token, parent, domain, job_id, attempt))


def job_ended() -> None:
    """When the worker's entry point returns (or raises): ends the run span at the attempt's recorded end and
    emits its queue wait. A no-op unless ``job_started`` opened a span."""
    opened = _open.get()
    if opened is None:
        return
    _open.set(None)
    tracer_, span, token, parent, domain, job_id, attempt = opened
    end = None
    try:
        otel_context.detach(token)
        with connection.cursor() as cursor:
            cursor.execute(ATTEMPT_SQL, [job_id, attempt])
            row = cursor.fetchone()
        if row is not None:
            created_at, due_at, dispatched_at, started_at, finished_at, outcome, error, worker, now = row
            timeline = stages.Attempt(
                attempt,
                created_at,
                due_at=due_at,
                dispatched_at=dispatched_at,
                started_at=started_at,
                finished_at=finished_at,
                outcome=outcome,
                error=error,
                worker=worker,
            )
            by_key = {s.key: s for s in timeline.stages(now)}
            queued = by_key["rq"]
            if queued.start is not None and queued.end is not None:
                _emit(tracer_, queued, parent, job_id, attempt, domain)
            run = by_key["worker"]
            span.set_attribute(ATTR_OUTCOME, outcome or "running")
            if worker:
                span.set_attribute(ATTR_WORKER, worker)
            if outcome in ("failed", "outcome_unknown", "superseded"):
                headline = stages.split_error(timeline.error)[1] if timeline.error else ""
                span.set_status(Status(StatusCode.ERROR, f"{outcome}: {headline}" if headline else outcome))
            if run.start is not None:
                end = max(run.start + run.duration, run.start)
    except Exception:
        log.exception("tracing: the times of job %s attempt %s were not read; its run span ends now", job_id, attempt)
    span.end(end_time=_ns(end) if end is not None else None)
