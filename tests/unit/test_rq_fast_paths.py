"""fast_paths: RQ's serializer check and timestamp parsing give RQ's answers, for less CPU."""

import datetime
import sys

import pytest
import redis
from rq import job as rq_job
from rq import registry as rq_registry
from rq import serializers, utils
from rq.serializers import JSONSerializer

from dispatch_app.rq.worker import fast_paths

pytestmark = pytest.mark.version_dependent


class NotASerializer:
    pass


def test_the_serializer_is_resolved_as_rq_resolves_it_for_every_kind_of_input():
    fast_paths.install()
    fast = rq_job.resolve_serializer
    assert fast(JSONSerializer) is JSONSerializer
    assert fast("json") is JSONSerializer
    assert fast(None) is serializers.PickleSerializer
    assert fast("rq.serializers.JSONSerializer") is JSONSerializer
    with pytest.raises(NotImplementedError, match="dumps, loads"):
        fast(NotASerializer())


def test_a_job_and_a_registry_on_the_json_serializer_skip_rqs_check(monkeypatch):
    """On every Python: RQ's own check (the Protocol isinstance) is not called for JSONSerializer."""
    fast_paths.install()
    for name in fast_paths.SERIALIZER_MODULES:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "resolve_serializer"):
            assert module.resolve_serializer is fast_paths.resolve_serializer, name
    unused = redis.Redis()  # never asked: constructors only
    checks = []
    original = fast_paths._resolve_serializer
    monkeypatch.setattr(fast_paths, "_resolve_serializer", lambda s=None: checks.append(s) or original(s))

    rq_job.Job("pf-1-1", connection=unused, serializer=JSONSerializer)
    rq_registry.StartedJobRegistry("delivery", connection=unused, serializer=JSONSerializer)
    assert checks == []

    # Another serializer still gets RQ's check.
    rq_job.Job("pf-1-1", connection=unused, serializer="json")
    assert checks == ["json"]


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-02T05:07:40.413979Z",
        "1999-01-31T23:59:59.000000Z",
        "2026-12-02T05:07:40Z",  # RQ's older layout, without microseconds
        "2026-12-02T05:07:40.4139Z",  # fewer digits: strptime's %f reads them
    ],
)
def test_timestamps_read_as_rq_reads_them(text):
    fast_paths.install()
    assert utils.utcparse is fast_paths.utcparse
    assert fast_paths.utcparse(text) == fast_paths._utcparse(text)
    assert fast_paths.utcparse(text).tzinfo is datetime.UTC
    assert rq_job.str_to_date(text.encode()) == fast_paths._utcparse(text)


@pytest.mark.parametrize(
    "text",
    [
        "2026-13-02T05:07:40.413979Z",  # no 13th month
        "2026-W49-3T05:07:40.413979Z",  # an ISO week date: fromisoformat would take it, strptime does not
        "2026-12-02T05:07:40.4+0100Z",  # an offset where the fraction goes
        "2026-12-02 05:07:40.413979Z",
        "2026-12-02T05:07:40.٤١٣٩٧٩Z",  # non-ASCII digits
        "",
    ],
)
def test_timestamps_rq_refuses_are_refused(text):
    with pytest.raises(ValueError):
        fast_paths._utcparse(text)
    with pytest.raises(ValueError):
        fast_paths.utcparse(text)


def test_a_restored_job_has_the_timestamps_rq_would_give_it():
    fast_paths.install()
    unused = redis.Redis()
    fields = {
        b"created_at": b"2026-12-02T05:07:40.413979Z",
        b"enqueued_at": b"2026-12-02T05:07:40.513979Z",
        b"started_at": b"2026-12-02T05:07:41.000001Z",
        b"data": b"",
    }
    job = rq_job.Job("pf-1-1", connection=unused, serializer=JSONSerializer)
    job.restore(fields)
    assert job.created_at == fast_paths._utcparse("2026-12-02T05:07:40.413979Z")
    assert job.enqueued_at == fast_paths._utcparse("2026-12-02T05:07:40.513979Z")
    assert job.started_at == fast_paths._utcparse("2026-12-02T05:07:41.000001Z")


def test_install_is_idempotent_and_leaves_a_replaced_function_alone(monkeypatch):
    fast_paths.install()
    assert fast_paths.install() == []

    def someone_elses(serializer=None):
        return JSONSerializer

    monkeypatch.setattr(rq_registry, "resolve_serializer", someone_elses)
    monkeypatch.setattr(utils, "utcparse", fast_paths._utcparse)  # back to RQ's: installed again
    assert fast_paths.install() == ["rq.utils.utcparse"]
    assert rq_registry.resolve_serializer is someone_elses
