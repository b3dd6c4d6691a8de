"""Without the optional extra (OpenTelemetry not installed) submit, dispatch and the worker run as before.

The test suite installs the extra (requirements/test.txt), so its absence is simulated: the import of
``opentelemetry`` fails while ``dispatch_app.timeline.tracing`` is reloaded, as on a machine without it.
"""

import importlib
import sys

import pytest

from dispatch_app import submit
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.models import Job, JobStatus
from dispatch_app.rq.publish import Publisher
from dispatch_app.rq.worker.launch import build_worker
from dispatch_app.timeline import tracing
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)

# What a job submitted by a traced process elsewhere carries.
STORED = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


@pytest.fixture
def without_otel(monkeypatch):
    for name in [n for n in sys.modules if n == "opentelemetry" or n.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # `import opentelemetry...` raises ImportError
    importlib.reload(tracing)
    yield
    monkeypatch.undo()
    importlib.reload(tracing)
    assert tracing.AVAILABLE


def test_the_tracing_module_imports_and_every_hook_is_a_no_op(without_otel):
    with pytest.raises(ImportError):
        import opentelemetry.trace  # noqa: F401
    assert not tracing.AVAILABLE
    assert tracing.capture() is None
    assert tracing.tracer() is None
    tracing.envelopes_dispatched([1, 2])
    tracing.job_started("delivery", 1, 1, STORED, None)
    tracing.job_ended()


def test_submit_dispatch_and_the_worker_run_without_opentelemetry(without_otel, redis_conn):
    fresh = submit("delivery", PAYLOADS["delivery"])
    traced_elsewhere = submit("delivery", PAYLOADS["delivery"])
    Job.objects.filter(pk=traced_elsewhere.pk).update(trace_context=STORED)
    assert Job.objects.get(pk=fresh.pk).trace_context is None

    conf = loop_settings()
    loop = DispatchLoop(conf, publisher=Publisher(conf, redis_conn))
    try:
        assert loop.run_once().dispatched == 2
    finally:
        loop.close()
    build_worker(["delivery"], connection=redis_conn, name="no-otel-worker").work(burst=True)

    assert list(Job.objects.order_by("pk").values_list("status", flat=True)) == [JobStatus.SUCCEEDED] * 2
