"""Tracing (issue 13 part 3): a traced submit's timeline as spans, read from the SDK's in-memory exporter.

Real PostgreSQL, real Redis, the real dispatch loop and the project's RQ worker (in this process, so its spans
reach the same exporter). The tracer provider is given to ``dispatch_app.timeline.tracing`` only, never installed
globally, so the rest of the suite runs without one.
"""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, StatusCode, TraceFlags

from dispatch_app import submit
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.domains.providers import LocalProvider, set_provider
from dispatch_app.models import DispatchEnvelope, Job, JobAttempt, JobStatus
from dispatch_app.rq.publish import Publisher
from dispatch_app.rq.worker.launch import build_worker
from dispatch_app.store import claim
from dispatch_app.timeline import tracing
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)  # the dispatcher and the worker commit, as in production

WORKER = "tracing-test-worker"
JOB_SPANS = set(tracing.SPAN_NAMES.values())


@pytest.fixture
def provider():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.exporter = exporter
    tracing.set_tracer_provider(provider)
    yield provider
    tracing.set_tracer_provider(None)
    provider.shutdown()


def dispatch(redis_conn) -> None:
    conf = loop_settings()
    loop = DispatchLoop(conf, publisher=Publisher(conf, redis_conn))
    try:
        assert loop.run_once().dispatched >= 1
    finally:
        loop.close()


def run_worker(redis_conn) -> None:
    build_worker(["delivery"], connection=redis_conn, name=WORKER).work(burst=True)


def job_spans(provider, attempt=None):
    """{span name: span} of the job spans (of one attempt), each name once."""
    spans = [s for s in provider.exporter.get_finished_spans() if s.name in JOB_SPANS]
    if attempt is not None:
        spans = [s for s in spans if s.attributes[tracing.ATTR_ATTEMPT] == attempt]
    by_name = {s.name: s for s in spans}
    assert len(by_name) == len(spans), [s.name for s in spans]
    return by_name


def ns(moment: datetime) -> int:
    return round((moment - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1)) * 1000


def test_a_traced_submit_gets_outbox_queue_and_run_spans_in_the_submitters_trace(provider, redis_conn):
    with provider.get_tracer("test").start_as_current_span("POST /orders") as request:
        job = submit("delivery", PAYLOADS["delivery"])
    caller = request.get_span_context()
    stored = Job.objects.get(pk=job.pk).trace_context
    flags = f"{int(caller.trace_flags):02x}"  # sampled, and the SDK's random-trace-id bit
    assert stored == job.trace_context == {"traceparent": f"00-{caller.trace_id:032x}-{caller.span_id:016x}-{flags}"}

    dispatch(redis_conn)
    assert set(job_spans(provider)) == {"productflow.outbox_wait"}  # the dispatcher's, at its mark
    run_worker(redis_conn)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    spans = job_spans(provider)
    assert set(spans) == {"productflow.outbox_wait", "productflow.queue_wait", "productflow.run"}
    stage_of = {"productflow.outbox_wait": "outbox", "productflow.queue_wait": "rq", "productflow.run": "worker"}
    for name, span in spans.items():
        assert span.context.trace_id == caller.trace_id, name
        assert span.parent.span_id == caller.span_id, name
        assert {k: span.attributes[k] for k in (tracing.ATTR_JOB_ID, tracing.ATTR_ATTEMPT, tracing.ATTR_DOMAIN)} == {
            tracing.ATTR_JOB_ID: job.pk,
            tracing.ATTR_ATTEMPT: 1,
            tracing.ATTR_DOMAIN: "delivery",
        }, name
        assert span.attributes[tracing.ATTR_STAGE] == stage_of[name]

    # The database's instants, not the hosts' clocks.
    envelope = DispatchEnvelope.objects.get(job=job, attempt=1)
    attempt = JobAttempt.objects.get(job=job, attempt=1)
    outbox, queued, run = spans["productflow.outbox_wait"], spans["productflow.queue_wait"], spans["productflow.run"]
    assert (outbox.start_time, outbox.end_time) == (ns(envelope.created_at), ns(envelope.dispatched_at))
    assert (queued.start_time, queued.end_time) == (ns(envelope.dispatched_at), ns(attempt.started_at))
    assert (run.start_time, run.end_time) == (ns(attempt.started_at), ns(attempt.finished_at))
    assert run.kind == trace.SpanKind.CONSUMER
    assert run.attributes[tracing.ATTR_OUTCOME] == "succeeded"
    assert run.attributes[tracing.ATTR_WORKER] == WORKER
    assert run.status.status_code == StatusCode.UNSET


def test_spans_the_work_makes_are_children_of_the_run_span(provider, redis_conn, tmp_path):
    made = []

    class InstrumentedVendor(LocalProvider):  # as an instrumented HTTP client would be
        def deliver(self, asset, target):
            with provider.get_tracer("vendor").start_as_current_span("vendor call") as span:
                made.append(span)
                return super().deliver(asset, target)

    set_provider(InstrumentedVendor(root=tmp_path, latency_ms=0))
    try:
        with provider.get_tracer("test").start_as_current_span("POST /orders"):
            submit("delivery", PAYLOADS["delivery"])
        dispatch(redis_conn)
        run_worker(redis_conn)
    finally:
        set_provider(None)

    run = job_spans(provider)["productflow.run"]
    assert len(made) == 1
    assert made[0].parent.span_id == run.context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN  # the worker left no span current behind it


def test_a_second_attempt_gets_its_own_spans_and_the_failed_run_is_an_error(provider, redis_conn, settings, tmp_path):
    settings.DISPATCH = {"SEND_BACKOFF_BASE": 0}
    with provider.get_tracer("test").start_as_current_span("POST /orders") as request:
        job = submit("delivery", PAYLOADS["delivery"])
    caller = request.get_span_context()

    set_provider(LocalProvider(root=tmp_path, latency_ms=0, failure_rate=1.0))
    try:
        dispatch(redis_conn)
        run_worker(redis_conn)  # the vendor fails: attempt 2 through the outbox
    finally:
        set_provider(None)
    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.SUBMITTED, 2)
    dispatch(redis_conn)
    run_worker(redis_conn)

    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 2)
    first, second = job_spans(provider, attempt=1), job_spans(provider, attempt=2)
    assert set(first) == set(second) == {"productflow.outbox_wait", "productflow.queue_wait", "productflow.run"}
    assert first["productflow.run"].status.status_code == StatusCode.ERROR
    assert first["productflow.run"].attributes[tracing.ATTR_OUTCOME] == "superseded"
    assert second["productflow.run"].attributes[tracing.ATTR_OUTCOME] == "succeeded"
    for span in [*first.values(), *second.values()]:
        assert (span.context.trace_id, span.parent.span_id) == (caller.trace_id, caller.span_id)
    # Attempt 2 starts where the re-dispatch created it, after attempt 1's run ended.
    retried = JobAttempt.objects.get(job=job, attempt=2)
    assert second["productflow.outbox_wait"].start_time == ns(retried.created_at)
    assert second["productflow.outbox_wait"].start_time >= first["productflow.run"].end_time


def test_a_delayed_envelope_has_a_backoff_span_before_its_outbox_wait(provider, redis_conn):
    with provider.get_tracer("test").start_as_current_span("POST /orders"):
        job = submit("delivery", PAYLOADS["delivery"], available_at=timedelta(hours=1))
    # An operator's "due now" (the admin action's statement): the delay ends at this moment.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_app_dispatchenvelope SET available_at = clock_timestamp() WHERE job_id = %s", [job.pk]
        )
    dispatch(redis_conn)

    spans = job_spans(provider)
    assert set(spans) == {"productflow.backoff", "productflow.outbox_wait"}
    envelope = DispatchEnvelope.objects.get(job=job)
    backoff, outbox = spans["productflow.backoff"], spans["productflow.outbox_wait"]
    assert backoff.start_time == ns(envelope.created_at)
    assert backoff.end_time == outbox.start_time <= outbox.end_time == ns(envelope.dispatched_at)


def test_an_untraced_submit_stores_nothing_and_emits_nothing(provider, redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    assert Job.objects.get(pk=job.pk).trace_context is None
    dispatch(redis_conn)
    run_worker(redis_conn)
    assert Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    assert job_spans(provider) == {}


def test_a_request_that_was_not_sampled_gets_no_job_spans(provider, redis_conn):
    unsampled = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    with trace.use_span(trace.NonRecordingSpan(unsampled)):
        job = submit("delivery", PAYLOADS["delivery"])
    assert job.trace_context == {"traceparent": f"00-{0x1234:032x}-{0x5678:016x}-00"}
    dispatch(redis_conn)
    run_worker(redis_conn)
    assert Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    assert job_spans(provider) == {}


def _mark_one(redis_conn) -> CaptureQueriesContext:
    batch = claim.claim_batch(10, 30)
    assert Publisher(loop_settings(), connection=redis_conn).send(batch.envelopes).sent == 1
    with CaptureQueriesContext(connection) as queries:
        assert claim.mark_dispatched([e.envelope_id for e in batch.envelopes], batch.token) == 1
    return [q["sql"] for q in queries.captured_queries if "dispatch_app_" in q["sql"]]  # not BEGIN/COMMIT


def test_without_a_tracer_provider_the_mark_makes_no_extra_query(redis_conn):
    # The API is installed but nothing configured it: OpenTelemetry's default proxy provider.
    assert tracing.tracer() is None
    with trace.use_span(trace.NonRecordingSpan(SpanContext(1, 2, is_remote=True, trace_flags=TraceFlags(1)))):
        submit("delivery", PAYLOADS["delivery"])
    assert len(_mark_one(redis_conn)) == 1


def test_with_a_tracer_provider_the_mark_reads_its_traced_envelopes_once(provider, redis_conn):
    with provider.get_tracer("test").start_as_current_span("POST /orders"):
        submit("delivery", PAYLOADS["delivery"])
    assert len(_mark_one(redis_conn)) == 2
    assert set(job_spans(provider)) == {"productflow.outbox_wait"}


def test_a_malformed_stored_context_traces_nothing_and_breaks_nothing(provider, redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    Job.objects.filter(pk=job.pk).update(trace_context={"traceparent": "not a traceparent"})
    dispatch(redis_conn)
    run_worker(redis_conn)
    assert Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    assert job_spans(provider) == {}


def test_tracing_runs_inside_the_callers_transaction_and_rolls_back_with_it(provider):
    with provider.get_tracer("test").start_as_current_span("POST /orders"):
        with pytest.raises(RuntimeError), transaction.atomic():
            submit("delivery", PAYLOADS["delivery"])
            raise RuntimeError("the caller's rollback")
    assert not Job.objects.exists()
