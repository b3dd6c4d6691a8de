"""Bad input is refused before anything is written; the caller's transaction owns the outbox write."""

from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction

from dispatch_app import JobSpec, submit, submit_many
from dispatch_app.models import DispatchEnvelope, Job
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db


def nothing_written() -> bool:
    return Job.objects.count() == 0 and DispatchEnvelope.objects.count() == 0


def payload(domain="delivery", **changes):
    result = dict(PAYLOADS[domain])
    for name, value in changes.items():
        if value is ...:
            result.pop(name)
        else:
            result[name] = value
    return result


@pytest.mark.parametrize(
    ("domain", "data", "kwargs", "message"),
    [
        ("retired", PAYLOADS["delivery"], {}, "unknown domain 'retired'"),
        (None, PAYLOADS["delivery"], {}, "unknown domain None"),
        ("delivery", payload(target=...), {}, "delivery.target: required field is missing"),
        ("delivery", payload(asset=42), {}, "delivery.asset: expected string, got int"),
        (
            "image_series",
            payload("image_series", count=True),
            {},
            "image_series.count: expected integer, got a boolean",
        ),
        ("agent", payload("agent", max_steps=2.5), {}, "agent.max_steps: expected integer, got float"),
        ("delivery", payload(priority=1), {}, "delivery: unknown field(s) priority"),
        ("delivery", payload(asset="x" * 70_000), {}, "over the limit of 65536"),
        ("delivery", payload(asset={"a", "b"}), {}, "payload.asset: a set is not JSON-serialisable"),
        ("delivery", payload(asset=float("nan")), {}, "payload.asset: nan is not JSON-serialisable"),
        ("delivery", ["asset-1"], {}, "payload must be a JSON object, got list"),
        ("delivery", PAYLOADS["delivery"], {"available_at": datetime(2030, 1, 1)}, "must be timezone-aware"),
        ("delivery", PAYLOADS["delivery"], {"available_at": "tomorrow"}, "must be a datetime or a timedelta"),
    ],
    ids=[
        "unknown-domain",
        "domain-not-a-string",
        "missing-field",
        "ill-typed-field",
        "bool-for-int",
        "float-for-int",
        "unknown-field",
        "oversized",
        "not-json-set",
        "not-json-nan",
        "not-an-object",
        "naive-datetime",
        "available-at-not-a-time",
    ],
)
def test_submit_refuses_bad_input_naming_the_problem_and_writes_nothing(domain, data, kwargs, message):
    with pytest.raises(ValidationError) as caught:
        submit(domain, data, **kwargs)
    assert message in " ".join(caught.value.messages)
    assert nothing_written()


def test_the_size_limit_is_a_setting(settings):
    settings.DISPATCH = {"PAYLOAD_MAX_BYTES": 64}
    with pytest.raises(ValidationError, match=r"over the limit of 64 \(DISPATCH\['PAYLOAD_MAX_BYTES'\]\)"):
        submit("delivery", payload(asset="x" * 64))
    assert nothing_written()


def test_submit_many_validates_every_job_before_writing_any():
    specs = [
        JobSpec("delivery", PAYLOADS["delivery"]),
        ("workflow", PAYLOADS["workflow"]),
        ("image_series", payload("image_series", count=0)),
    ]
    with pytest.raises(ValidationError, match=r"jobs\[2\]: image_series\.count: must be >= 1"):
        submit_many(specs)
    assert nothing_written()


def test_the_callers_rollback_removes_job_and_envelope():
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        submit("delivery", PAYLOADS["delivery"])
        submit_many([("workflow", PAYLOADS["workflow"])] * 2)
        assert Job.objects.count() == 3
        raise Abort
    assert nothing_written()


def test_a_valid_submit_writes_job_and_envelope_with_database_times():
    job = submit("delivery", PAYLOADS["delivery"], available_at=timedelta(minutes=5))
    envelope = DispatchEnvelope.objects.get(job=job)
    assert (envelope.attempt, envelope.domain, envelope.queue, envelope.status) == (
        1,
        "delivery",
        "delivery",
        "pending",
    )
    job.refresh_from_db()
    assert job.status == "submitted"
    assert timedelta(minutes=4) < envelope.available_at - job.submitted_at <= timedelta(minutes=5, seconds=5)
