"""A ``django.tasks`` task enqueued inside a span gets the same spans as a ``submit`` (the backend is built on it)."""

import pytest

from dispatch_app.models import Job, JobStatus
from dispatch_app.rq.worker.launch import build_worker
from dispatch_app.timeline import tracing
from tests.integration.timeline.test_tracing import dispatch, job_spans, provider  # noqa: F401 - the fixture
from tests.tasks import sample

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]


def test_an_enqueued_task_runs_in_the_enqueuers_trace(provider, redis_conn):  # noqa: F811
    with provider.get_tracer("test").start_as_current_span("POST /orders") as request:
        result = sample.add.enqueue(2, b=3)
    caller = request.get_span_context()
    job = Job.objects.get(pk=int(result.id))
    assert job.trace_context["traceparent"].startswith(f"00-{caller.trace_id:032x}-{caller.span_id:016x}-")

    dispatch(redis_conn)
    build_worker([job.domain], connection=redis_conn, name="tracing-task-worker").work(burst=True)

    assert Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    spans = job_spans(provider)
    assert set(spans) == {"productflow.outbox_wait", "productflow.queue_wait", "productflow.run"}
    for span in spans.values():
        assert (span.context.trace_id, span.parent.span_id) == (caller.trace_id, caller.span_id)
        assert span.attributes[tracing.ATTR_DOMAIN] == job.domain
        assert span.attributes[tracing.ATTR_JOB_ID] == job.pk
