"""The payload checks' size bound is a lower bound of the encoded size (issue 56.6): a value whose JSON fits the
limit exactly is never refused for its size, however its bytes are made (non-ASCII text, big ints, floats, deep
or wide nesting); one byte less and a value at most as big as the bound's reach is refused. ``shown`` echoes any
value bounded."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError
from hypothesis import given
from hypothesis import strategies as st

from dispatch_app.outbox import payloads

# What jsonb stores (no NUL, no surrogates) and json.dumps writes (finite floats, ints within 4,300 digits).
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30)
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**4000), max_value=10**4000),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
JSON = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(TEXT, inner, max_size=6)),
    max_leaves=40,
)


def size(value) -> int:
    """What the outbox compares with the limit: compact JSON, ASCII, in bytes."""
    return len(json.dumps(value, allow_nan=False, separators=(",", ":")).encode())


@given(JSON)
def test_a_value_that_fits_exactly_is_never_refused_for_its_size(value):
    payloads.check(value, max_bytes=size(value))
    payloads.check_depth(value, "args", max_bytes=size(value))


@given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=50))
def test_the_bound_is_exact_for_small_ints_and_refuses_one_byte_less(digits):
    # One-digit ints: the bound is the exact size, so one byte less is refused.
    with pytest.raises(ValidationError, match="over the limit"):
        payloads.check(digits, max_bytes=size(digits) - 1)


@pytest.mark.parametrize(
    "value",
    ["x" * 10**6, b"x" * 10**6, 10**5000, ["x" * 1000] * 10**5, {str(i): i for i in range(10**4)}, object()],
    ids=["str", "bytes", "huge-int", "list", "dict", "object"],
)
def test_shown_is_short_whatever_the_value(value):
    assert len(payloads.shown(value)) < 80
