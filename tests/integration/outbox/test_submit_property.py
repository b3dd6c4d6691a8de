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
from hypothesis import event, given
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


def weighted(*choices):
    """One of the strategies, picked with these weights (st.one_of would pick among distinct ones evenly)."""
    pool = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(pool) - 1).flatmap(lambda i: pool[i])


SHALLOW = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children),
        st.dictionaries(KEYS, children, max_size=4),
    ),
    max_leaves=20,
)
# Deep nesting is one kind of junk among several, not half of it.
JUNK = weighted((3, SHALLOW), (1, st.integers(min_value=0, max_value=3000).map(_nested)))
PLAIN = st.text(max_size=12)  # no surrogates: the shapes that can be written
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
NAMES = st.sampled_from(["delivery", "default", "workflow", "agent"])
DOMAINS = weighted((8, NAMES), (1, st.sampled_from(["retired", ""])), (1, JUNK))
AVAILABLE_AT = weighted(
    (4, st.none()),
    (1, st.timedeltas()),
    (1, st.timedeltas(min_value=timedelta(days=-1), max_value=timedelta(0))),
    (1, st.datetimes(timezones=st.just(UTC))),
    (1, st.datetimes()),
    (1, JUNK),
)


@st.composite
def payloads(draw, domain):
    """Shapes near the domain's schema (some of them writable) as often as plain junk."""
    text = weighted((6, PLAIN.filter(str.strip)), (1, TEXT), (1, JUNK))
    shaped = {
        "delivery": st.fixed_dictionaries({"asset": text, "target": text}, optional={"extra": JUNK}),
        "workflow": st.fixed_dictionaries({"workflow_id": text, "steps": st.one_of(st.lists(text, max_size=3), JUNK)}),
        "agent": st.fixed_dictionaries({"goal": text, "max_steps": st.one_of(st.integers(-2, 12), JUNK)}),
        "default": st.fixed_dictionaries(
            {"task": TASK_PATHS},
            optional={
                "args": st.one_of(st.lists(st.one_of(PLAIN, st.integers(), SHALLOW), max_size=3), JUNK),
                "kwargs": st.one_of(st.dictionaries(PLAIN, SHALLOW, max_size=3), JUNK),
                "backend": st.one_of(st.just("default"), JUNK),
            },
        ),
    }.get(domain if isinstance(domain, str) else "", JUNK)
    return draw(weighted((3, shaped), (1, JUNK), (1, st.dictionaries(KEYS, JUNK, max_size=4))))


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    yield from provider_kit.installed(tmp_path_factory.mktemp("provider"))


def counts() -> tuple[int, int]:
    return Job.objects.count(), DispatchEnvelope.objects.count()


@given(data=st.data(), domain=DOMAINS, available_at=AVAILABLE_AT)
def test_junk_is_refused_whole_or_runs_without_a_crash(provider, data, domain, available_at):
    payload = data.draw(payloads(domain), label="payload")
    before = counts()
    try:
        job = submit(domain, payload, available_at=available_at)
    except ValidationError as exc:
        event(f"refused: {getattr(exc, 'code', None)}")
        assert exc.messages and all(isinstance(m, str) for m in exc.messages)
        assert counts() == before
        return
    assert counts() == (before[0] + 1, before[1] + 1)
    event("written, then run")
    assert is_registered(domain)
    outcome = import_attribute(get_domain(domain).task_path)(job.pk, 1)
    assert isinstance(outcome, dict)
    job.refresh_from_db()
    # Finished either way (its code may fail, the project's may not), or refused at the start (not due yet).
    assert job.status in ("succeeded", "failed") or "refused" in outcome, (job.status, outcome)
