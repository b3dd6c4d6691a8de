"""``Task.enqueue`` through the OutboxBackend refuses what the outbox cannot store: a ValidationError (also an
InvalidTask, as django.tasks callers catch) naming the argument, nothing written. Property: generated junk
arguments are refused whole, or stored as a job the task entry point then runs without a crash."""

from __future__ import annotations

import gc
import tracemalloc
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone
from hypothesis import event, given
from hypothesis import strategies as st

from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.tasks.compat import InvalidTask
from dispatch_app.tasks.run import entry
from tests.integration.outbox.test_submit_property import JUNK, PLAIN, SHALLOW, TEXT
from tests.tasks import sample

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]


def counts() -> tuple[int, int]:
    return Job.objects.count(), DispatchEnvelope.objects.count()


def nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("a\x00b",), {}, "payload.args[0]: contains a NUL character"),
        (("\udc00",), {}, "payload.args[0]: contains an unpaired surrogate"),
        ((), {"x": {1: 2}}, "payload.kwargs.x: key '1' is a int, not a string"),
        ((), {"x": {"\x00": 2}}, "contains a NUL character"),
        ((nested(5000),), {}, "args: nested deeper than"),
        ((float("nan"),), {}, "nan is not JSON-serialisable"),
        ((object(),), {}, "arguments are not JSON"),
    ],
    ids=["nul", "surrogate", "int-key", "nul-key", "deep", "nan", "object"],
)
def test_bad_arguments_are_a_validation_error_and_nothing_is_written(args, kwargs, message):
    with pytest.raises(ValidationError) as caught:
        sample.echo.enqueue(*args, **kwargs)
    assert isinstance(caught.value, InvalidTask)
    assert message in " ".join(caught.value.messages)
    assert counts() == (0, 0)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([1] * 25_000_000,), {}, "args: 25000000 items; at least"),
        ((range(10**12),), {}, "args: 1000000000000 items"),  # normalize_json would copy it item by item
        ((), {"blob": "x" * 50_000_000}, "kwargs: a str of length 50000000"),
        ((), {"blob": b"x" * 50_000_000}, "kwargs: a bytes of length 50000000"),
        ((["x" * 1_000_000] * 50,), {}, "args: a str of length 1000000"),
    ],
    ids=["25M-ints", "range", "long-str", "long-bytes", "repeated-str"],
)
def test_oversized_arguments_are_refused_on_their_size_in_bounded_memory(args, kwargs, message):
    gc.collect()
    tracemalloc.start()
    try:
        with pytest.raises(ValidationError) as caught:
            sample.echo.enqueue(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(caught.value, InvalidTask) and caught.value.code == "payload_too_large"
    assert message in caught.value.messages[0] and "over the limit of 65536" in caught.value.messages[0]
    assert peak < 1_000_000, f"refusing took {peak / 1e6:.1f} MB"  # the walk's stack, not the arguments' size
    assert counts() == (0, 0)


def test_a_run_after_out_of_range_is_refused():
    with pytest.raises(ValidationError, match="available_at must be within 366 days"):
        sample.echo.using(run_after=timezone.now() + timedelta(days=400)).enqueue()
    assert counts() == (0, 0)


@given(
    args=st.lists(st.one_of(JUNK, TEXT, PLAIN, SHALLOW), max_size=3),
    kwargs=st.dictionaries(st.one_of(TEXT, PLAIN), st.one_of(JUNK, SHALLOW), max_size=3),
)
def test_junk_arguments_are_refused_whole_or_run_without_a_crash(args, kwargs):
    before = counts()
    try:
        result = sample.echo.enqueue(*args, **kwargs)
    except ValidationError as exc:
        event(f"refused: {getattr(exc, 'code', None)}")
        assert isinstance(exc, InvalidTask) and exc.messages
        assert counts() == before
        return
    except TypeError:
        # Python's own call check (a kwargs key that is not an identifier-like string is still fine in **);
        # nothing of ours ran.
        assert counts() == before
        return
    assert counts() == (before[0] + 1, before[1] + 1)
    event("written, then run")
    outcome = entry.default(int(result.id), 1)
    assert "succeeded" in outcome, outcome
