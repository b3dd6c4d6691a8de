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
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError

# Deepest nesting of objects and lists a payload may have (README, "Submitting work").
PAYLOAD_MAX_DEPTH = 32
# What jsonb cannot store in a string: NUL, and surrogates (valid UTF-8 has none, paired or not).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SHOWN = 40


def _key(path: str, key: str) -> str:
    shown = key if len(key) <= _SHOWN else key[:_SHOWN] + "..."
    return f"{path}[{shown!r}]" if not shown.isidentifier() else f"{path}.{shown}"


def _text(path: str, value: str) -> None:
    bad = _UNSTORABLE.search(value)
    if bad is not None:
        what = "a NUL character" if bad.group() == "\x00" else "an unpaired surrogate"
        raise ValidationError(f"{path}: contains {what} (at {bad.start()})", code="invalid_text")


def check(value: Any, where: str = "payload", *, max_depth: int = PAYLOAD_MAX_DEPTH, max_items: int = 0) -> None:
    """Raise ``ValidationError`` naming the first value jsonb would refuse, or nesting over ``max_depth``.

    ``max_items``: stop after this many values (each is at least a byte of JSON: the size limit bounds them).
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    seen = 0
    while stack:
        item, path, depth = stack.pop()
        seen += 1
        if max_items and seen > max_items:
            raise ValidationError(f"{where}: more than {max_items} values", code="payload_too_large")
        if isinstance(item, str):
            _text(path, item)
        elif item is None or isinstance(item, (bool, int)):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValidationError(f"{path}: {item} is not JSON-serialisable (not a finite number)", code="not_json")
        elif isinstance(item, dict):
            if depth >= max_depth:
                raise ValidationError(f"{path}: nested deeper than {max_depth} levels", code="too_deep")
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ValidationError(
                        f"{path}: key {str(key)[:_SHOWN]!r} is a {type(key).__name__}, not a string",
                        code="invalid_key",
                    )
                _text(f"{path} key {key[:_SHOWN]!r}", key)
                stack.append((child, _key(path, key), depth + 1))
        elif isinstance(item, (list, tuple)):
            if depth >= max_depth:
                raise ValidationError(f"{path}: nested deeper than {max_depth} levels", code="too_deep")
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
        else:
            raise ValidationError(f"{path}: a {type(item).__name__} is not JSON-serialisable", code="not_json")


def check_depth(value: Any, where: str, *, max_depth: int = PAYLOAD_MAX_DEPTH, max_items: int = 0) -> None:
    """Only the nesting (any mapping or sequence), for values a library normalises recursively first."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if max_items and seen > max_items:
            raise ValidationError(f"{where}: more than {max_items} values", code="payload_too_large")
        if isinstance(item, (str, bytes, bytearray)):
            continue
        if isinstance(item, (Mapping, Sequence)):
            if depth >= max_depth:
                raise ValidationError(f"{where}: nested deeper than {max_depth} levels", code="too_deep")
            children = list(item.keys()) + list(item.values()) if isinstance(item, Mapping) else list(item)
            stack.extend((child, depth + 1) for child in children)
