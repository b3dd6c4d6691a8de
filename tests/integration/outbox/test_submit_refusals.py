"""Input that used to fail in the database or the encoder (aborting the caller's transaction) is refused at
the door: a ValidationError naming the field, nothing written, and the caller's transaction still usable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction

from dispatch_app import submit, submit_many
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.outbox.payloads import PAYLOAD_MAX_DEPTH
from tests.factories import PAYLOADS

pytestmark = [pytest.mark.django_db, pytest.mark.version_dependent]


def nested(depth: int):
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


DELIVERY = PAYLOADS["delivery"]


@pytest.mark.parametrize(
    ("domain", "data", "kwargs", "message"),
    [
        ("delivery", {**DELIVERY, "asset": "a\x00b"}, {}, "payload.asset: contains a NUL character"),
        ("delivery", {**DELIVERY, "asset": "\ud800"}, {}, "payload.asset: contains an unpaired surrogate"),
        ("delivery", {**DELIVERY, "a\x00": 1}, {}, "payload key 'a\\x00': contains a NUL character"),
        ("delivery", {**DELIVERY, 1: "x", "z": 2}, {}, "payload: key '1' is a int, not a string"),
        ("delivery", {**DELIVERY, 1: "x", (2,): 2}, {}, "is a int, not a string"),
        ("delivery", {**DELIVERY, "asset": nested(5000)}, {}, f"nested deeper than {PAYLOAD_MAX_DEPTH} levels"),
        ("delivery", {**DELIVERY, "asset": nested(PAYLOAD_MAX_DEPTH)}, {}, "nested deeper than"),
        ("delivery", DELIVERY, {"available_at": timedelta.max}, "available_at must be within 366 days of now"),
        ("delivery", DELIVERY, {"available_at": timedelta.min}, "available_at must be within 366 days of now"),
        ("delivery", DELIVERY, {"available_at": datetime.max.replace(tzinfo=UTC)}, "within 366 days"),
        ("delivery", DELIVERY, {"available_at": datetime.min.replace(tzinfo=UTC)}, "within 366 days"),
        ("default", {"task": "os.system"}, {}, "default.task: 'os.system' is not a django.tasks Task"),
        ("default", {"task": "no.such.module.fn"}, {}, "default.task: 'no.such.module.fn' does not import"),
        ("default", {"task": "tests.tasks.sample.add\x00"}, {}, "contains a NUL character"),
    ],
    ids=[
        "nul",
        "surrogate",
        "nul-in-key",
        "int-key",
        "mixed-unknown-keys",
        "deep",
        "just-too-deep",
        "timedelta-max",
        "timedelta-min",
        "datetime-max",
        "datetime-min",
        "task-not-a-task",
        "task-not-importable",
        "task-nul",
    ],
)
def test_bad_input_is_a_validation_error_and_the_transaction_survives(domain, data, kwargs, message):
    with transaction.atomic():
        with pytest.raises(ValidationError) as caught:
            submit(domain, data, **kwargs)
        assert message in " ".join(caught.value.messages)
        # Nothing reached the database: the caller's transaction goes on.
        assert Job.objects.count() == 0 and DispatchEnvelope.objects.count() == 0


def test_a_task_for_a_backend_that_does_not_serve_the_queue_is_refused(settings):
    settings.TASKS = {
        "default": {"BACKEND": "dispatch_app.tasks.OutboxBackend", "QUEUES": ["default"]},
        "other": {"BACKEND": "dispatch_app.tasks.OutboxBackend", "QUEUES": ["safe"]},
    }
    with pytest.raises(ValidationError, match="backend 'default', which does not serve queue 'safe'"):
        submit("safe", {"task": "tests.tasks.sample.add"})
    with pytest.raises(ValidationError, match="backend 'nope' is not an OutboxBackend"):
        submit("default", {"task": "tests.tasks.sample.add", "backend": "nope"})


def test_nesting_up_to_the_limit_is_accepted_and_one_more_level_is_not():
    # The payload object is level 0 and its "args" list level 1: PAYLOAD_MAX_DEPTH - 2 more lists fit.
    task = "tests.tasks.sample.echo"
    assert submit("default", {"task": task, "args": [nested(PAYLOAD_MAX_DEPTH - 2)]}).pk
    with pytest.raises(ValidationError, match=r"payload.args\[0\]" + r"(\[0\])*: nested deeper"):
        submit("default", {"task": task, "args": [nested(PAYLOAD_MAX_DEPTH - 1)]})


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["delivery"], "jobs: a job spec is a JobSpec or a (domain, payload[, available_at]) tuple, got str"),
        ([("delivery",)], "got tuple of 1"),
        ([("delivery", DELIVERY), 7], "jobs[1]: a job spec is a JobSpec"),
        ("delivery", "submit_many takes a list of job specs, got str"),
        (None, "submit_many takes a list of job specs, got NoneType"),
    ],
)
def test_malformed_specs_are_refused(specs, message):
    with pytest.raises(ValidationError) as caught:
        submit_many(specs)
    assert message.replace("jobs: ", "") in " ".join(caught.value.messages)
    assert Job.objects.count() == 0
