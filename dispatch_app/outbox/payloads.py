"""What a submitted payload may hold: JSON that PostgreSQL's jsonb stores as it is, within bounds.

``json.dumps`` accepts more than jsonb does, and some of it fails only in the
database, aborting the caller's whole transaction (a ``DataError``), or in the
encoder itself (a ``RecursionError``): a NUL (``"a\\x00b"``) or an unpaired
surrogate (``"\\ud800"``) in any string, keys included; keys that are not strings
(``json.dumps`` turns ``1`` into ``"1"``, and ``{1: .., "1": ..}`` into two equal
keys); nesting a thousand deep. ``check`` walks the value once, without
recursion, and raises a ``ValidationError`` naming the first place that is wrong,
before anything is encoded or sent. Payloads come from callers and browsers: they
are input, never trusted.

Size first: the walk keeps a lower bound of the value's encoded size and compares
each list's, object's and string's length with what is left of the limit *before*
it reads their items or characters, so refusing ``[1] * 25_000_000`` or a list of
long strings costs at most the limit's worth of work and memory for the walk's own
stack (its depth), whatever the size of the value. Errors echo a caller's value cut
to a short prefix with its length (``shown``).
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError

# Deepest nesting of objects and lists a payload may have (README, "Submitting work").
PAYLOAD_MAX_DEPTH = 32
# What jsonb cannot store in a string: NUL, and surrogates (valid UTF-8 has none, paired or not).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SHOWN = 40
_SETTING = "DISPATCH['PAYLOAD_MAX_BYTES']"
# log10(2), rounded down: an int of b bits has at least floor((b - 1) * this) + 1 decimal digits.
_DIGITS_PER_BIT = 0.30102999


def shown(value: Any, limit: int = _SHOWN) -> str:
    """A caller's value as an error message may echo it: its repr, cut to ``limit`` characters with its length.

    Bounded in time and size whatever the value (a 1 MB domain name, a huge int, a long list).
    """
    if isinstance(value, (str, bytes, bytearray)):
        if len(value) <= limit:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    text = reprlib.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _key(path: str, key: str) -> str:
    return f"{path}.{key}" if len(key) <= _SHOWN and key.isidentifier() else f"{path}[{shown(key)}]"


def _path(parent: str, key: str | int | None) -> str:
    """An item's place, made only when a message or a nested value needs it (not for every item walked)."""
    if key is None:
        return parent
    return f"{parent}[{key}]" if isinstance(key, int) else _key(parent, key)


def _text(value: str, parent: str, key: str | int | None) -> None:
    bad = _UNSTORABLE.search(value)
    if bad is not None:
        what = "a NUL character" if bad.group() == "\x00" else "an unpaired surrogate"
        raise ValidationError(f"{_path(parent, key)}: contains {what} (at {bad.start()})", code="invalid_text")


def _int_bytes(value: int) -> int:
    """Fewest characters ``json.dumps`` writes for this int (its decimal digits and sign), from its bit length."""
    bits = abs(value).bit_length()
    return (int((bits - 1) * _DIGITS_PER_BIT) + 1 if bits else 1) + (value < 0)


class _Budget:
    """A lower bound of the JSON ``json.dumps`` writes (compact, ASCII), refused as soon as it passes the limit."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.used = max_bytes, 0

    def spend(self, size: int, parent: str, key: str | int | None = None, what: str = "") -> None:
        """Add ``size`` bytes; past the limit, refuse naming the place (and ``what`` was there)."""
        self.used += size
        if self.used > self.max_bytes:
            here = f"{_path(parent, key)}: {what}; " if what else f"{_path(parent, key)}: "
            raise ValidationError(
                f"{here}at least {self.used} bytes as JSON, over the limit of {self.max_bytes} ({_SETTING})",
                code="payload_too_large",
            )

    def open(self, path: str, size: int, depth: int, max_depth: int, extra_per_item: int = 0) -> None:
        """Enter a list or object of ``size`` items: its depth, then its length against what is left, first."""
        if depth >= max_depth:
            raise ValidationError(f"{path}: nested deeper than {max_depth} levels", code="too_deep")
        # Brackets and commas (and per item a key's quotes and colon); each item is at least a byte more.
        frame = 2 + max(size - 1, 0) + size * extra_per_item
        if self.used + frame + size > self.max_bytes:
            self.spend(frame + size, path, None, f"{size} items")
        self.spend(frame, path)


def check(value: Any, where: str = "payload", *, max_bytes: int, max_depth: int = PAYLOAD_MAX_DEPTH) -> None:
    """Raise ``ValidationError`` naming the first value jsonb would refuse, nesting over ``max_depth``, or a
    value whose JSON would be over ``max_bytes`` (a lower bound, so nothing that would fit is refused)."""
    budget = _Budget(max_bytes)
    # One frame per open list or object: its path, its items' depth, whether it is an object, its (key, item)s.
    stack: list[tuple[str, int, bool, Iterator]] = []
    parent, key, item, depth = where, None, value, 0
    while True:
        if isinstance(item, (dict, list, tuple)):
            path = _path(parent, key)
            is_object = isinstance(item, dict)
            budget.open(path, len(item), depth, max_depth, extra_per_item=3 if is_object else 0)
            stack.append((path, depth + 1, is_object, iter(item.items()) if is_object else enumerate(item)))
        else:
            _scalar(item, parent, key, budget)
        while stack:
            parent, depth, is_object, items = stack[-1]
            nxt = next(items, None)
            if nxt is None:
                stack.pop()
                continue
            key, item = nxt
            if is_object:
                _object_key(key, parent, budget)
            break
        else:
            return


def _object_key(key: Any, parent: str, budget: _Budget) -> None:
    if not isinstance(key, str):
        text = str(key) if isinstance(key, int) and not isinstance(key, bool) and key.bit_length() <= 64 else key
        raise ValidationError(
            f"{parent}: key {shown(text)} is a {type(key).__name__}, not a string", code="invalid_key"
        )
    budget.used += len(key)  # counted before the key is read; its place is spelled out only for a message
    if budget.used > budget.max_bytes:
        budget.spend(0, f"{parent} key {shown(key)}", None, f"a key of {len(key)} characters")
    if _UNSTORABLE.search(key) is not None:
        _text(key, f"{parent} key {shown(key)}", None)


def _scalar(item: Any, parent: str, key: str | int | None, budget: _Budget) -> None:
    """Check one value that is no list or object, its size counted before its characters are read."""
    if isinstance(item, str):
        budget.spend(len(item) + 2, parent, key, f"a string of {len(item)} characters")
        _text(item, parent, key)
    elif item is None or isinstance(item, bool):
        budget.spend(5 if item is False else 4, parent, key)
    elif isinstance(item, int):
        budget.spend(_int_bytes(item), parent, key)
    elif isinstance(item, float):
        if not math.isfinite(item):
            raise ValidationError(
                f"{_path(parent, key)}: {item} is not JSON-serialisable (not a finite number)", code="not_json"
            )
        budget.spend(3, parent, key)  # "0.0" is the shortest
    else:
        raise ValidationError(
            f"{_path(parent, key)}: a {type(item).__name__} is not JSON-serialisable", code="not_json"
        )


def check_depth(value: Any, where: str, *, max_bytes: int, max_depth: int = PAYLOAD_MAX_DEPTH) -> None:
    """Only the nesting and the size (any mapping or sequence), for values a library normalises recursively first.

    The size is bounded as in ``check`` (lengths first), so the normalisation that follows never walks a value
    that could not fit: django.tasks' ``normalize_json`` copies every item, ``range(10**12)`` included.
    """
    budget = _Budget(max_bytes)
    stack: list[tuple[int, Iterator]] = [(0, iter((value,)))]
    while stack:
        depth, items = stack[-1]
        item = next(items, _END)
        if item is _END:
            stack.pop()
            continue
        if isinstance(item, (str, bytes, bytearray)):
            budget.spend(len(item) + 2, where, None, f"a {type(item).__name__} of length {len(item)}")
        elif isinstance(item, Mapping):
            budget.open(where, len(item), depth, max_depth, extra_per_item=1)  # the colons; keys are items
            stack.append((depth + 1, (x for pair in item.items() for x in pair)))
        elif isinstance(item, Sequence):
            budget.open(where, len(item), depth, max_depth)
            stack.append((depth + 1, iter(item)))
        else:
            budget.spend(1, where)


_END = object()
