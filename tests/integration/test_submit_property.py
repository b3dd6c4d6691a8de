"""Property: whatever junk reaches ``submit``, it is either a ValidationError with nothing written, or a
row that the worker's entry point then runs without a crash in the project's code.

Hypothesis generates domains, payloads (NUL and surrogates in strings and keys, keys of every type, sets,
bytes, NaN, deep nesting, task paths that are not tasks) and available_at values. A written job is run by
its domain's entry point, resolved the way RQ resolves it (rq.utils.import_attribute) after admission.
CI runs the "ci" profile; ``HYPOTHESIS_PROFILE=thorough`` runs 10,000 examples.
"""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from django.core.exceptions import ValidationError
from hypothesis import given
from hypothesis import strategies as st
from rq.utils import import_attribute

from dispatch_app import submit
from dispatch_app.domains import get_domain, is_registered
from dispatch_app.models import DispatchEnvelope, Job
from tests.integration import provider_kit

pytestmark = pytest.mark.django_db(transaction=True)

# Every code point, surrogates and NUL included.
TEXT = st.text(st.characters(exclude_categories=()), max_size=12)
KEYS = st.one_of(TEXT, st.integers(), st.none(), st.booleans(), st.floats(), st.tuples(st.integers()))
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    TEXT,
    st.binary(max_size=4),
    st.frozensets(st.integers(), max_size=2),
)


class Deep(list):
    """A list nested ``depth`` deep, with a short repr (printing a falsifying example must not recurse)."""

    def __repr__(self) -> str:
        return f"<{self.depth} nested lists>"


def _nested(depth: int):
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    deep = Deep([value])
    deep.depth = depth + 1
    return deep


JUNK = st.one_of(
    st.recursive(
        LEAVES,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.tuples(children),
            st.dictionaries(KEYS, children, max_size=4),
        ),
        max_leaves=20,
    ),
    st.integers(min_value=0, max_value=3000).map(_nested),
)
TASK_PATHS = st.one_of(
    st.sampled_from(
        [
            "tests.tasks.sample.echo",
            "tests.tasks.sample.add",
            "tests.tasks.sample.explode",
            "tests.tasks.sample.returns_no_json",
            "os.system",
            "no.such.module.fn",
            "dispatch_app.run.delivery",
        ]
    ),
    TEXT,
)
PAYLOADS = st.one_of(
    JUNK,
    st.fixed_dictionaries({"asset": st.one_of(TEXT, JUNK), "target": st.one_of(TEXT, JUNK)}),
    st.fixed_dictionaries(
        {"task": TASK_PATHS},
        optional={"args": st.one_of(st.lists(JUNK, max_size=3), JUNK), "kwargs": JUNK, "backend": JUNK},
    ),
    st.dictionaries(KEYS, JUNK, max_size=4),
)
DOMAINS = st.one_of(st.sampled_from(["delivery", "default", "workflow", "agent", "retired"]), JUNK)
AVAILABLE_AT = st.one_of(
    st.none(),
    st.timedeltas(),
    st.datetimes(timezones=st.just(UTC)),
    st.datetimes(),
    st.just(timedelta(0)),
    JUNK,
)


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    yield from provider_kit.installed(tmp_path_factory.mktemp("provider"))


def counts() -> tuple[int, int]:
    return Job.objects.count(), DispatchEnvelope.objects.count()


@given(domain=DOMAINS, payload=PAYLOADS, available_at=AVAILABLE_AT)
def test_junk_is_refused_whole_or_runs_without_a_crash(provider, domain, payload, available_at):
    before = counts()
    try:
        job = submit(domain, payload, available_at=available_at)
    except ValidationError as exc:
        assert exc.messages and all(isinstance(m, str) for m in exc.messages)
        assert counts() == before
        return
    assert counts() == (before[0] + 1, before[1] + 1)
    assert is_registered(domain)
    outcome = import_attribute(get_domain(domain).task_path)(job.pk, 1)
    assert isinstance(outcome, dict)
    job.refresh_from_db()
    # Finished either way (its code may fail, the project's may not), or refused at the start (not due yet).
    assert job.status in ("succeeded", "failed") or "refused" in outcome, (job.status, outcome)
