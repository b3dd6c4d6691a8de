"""What a browser sends is input, not data: ids parsed strictly, NUL refused before it reaches PostgreSQL.

``str.isdigit()`` accepts "²" and "①", which ``int()`` refuses (a 500); ``int()`` accepts "٣" and huge numbers
that PostgreSQL's bigint refuses (another 500). An id here is 1 to 18 ASCII digits, nothing else. A NUL
character cannot be stored in a PostgreSQL text value (psycopg raises DataError), so any parameter carrying one
is refused with a message naming it.
"""

from __future__ import annotations

import re

_ID = re.compile(r"[0-9]{1,18}")


def parse_id(text) -> int | None:
    """A row id from a query or form value, or None when it is not one."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    return int(text) if _ID.fullmatch(text) else None


def parse_ids(values) -> list[int] | None:
    """Every value an id (sorted, unique), or None if any is not: a list with a bad id is refused whole."""
    ids = [parse_id(v) for v in values]
    if any(i is None for i in ids):
        return None
    return sorted(set(ids))


def nul_parameter(*query_dicts) -> str | None:
    """The name of the first parameter (name or value) holding a NUL character, or None."""
    for params in query_dicts:
        for key, values in params.lists():
            if "\x00" in key or any("\x00" in v for v in values):
                return key.replace("\x00", "\\x00")
    return None


def refuse_text(value: str, what: str) -> str | None:
    """Why a free-text value (a reason) is refused, or None when it is fine."""
    if "\x00" in value:
        return f"{what} contains a NUL character, which cannot be stored; nothing was done."
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return f"{what} contains an unpaired surrogate, which cannot be stored; nothing was done."
    return None
