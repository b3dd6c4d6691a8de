"""Checking one setting's value: shared by ``conf`` and ``domains.policy``, importing neither."""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def coerce_number(where: str, value: Any, kind: type, minimum: float | None, maximum: float | None) -> Any:
    """A number of ``kind`` within [minimum, maximum], or an error naming ``where``."""
    # NaN and infinities pass or break every comparison below; a bool is no count.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ImproperlyConfigured(f"{where} must be a number, got {value!r}")
    if kind is int and int(value) != value:
        raise ImproperlyConfigured(f"{where} must be a whole number, got {value!r}")
    value = kind(value)
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{where} must be >= {minimum:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{where} must be <= {maximum:g}, got {value!r}")
    return value
