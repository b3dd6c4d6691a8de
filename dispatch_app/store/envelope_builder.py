"""One builder for a new envelope's columns, shared by submit, re-dispatch and re-arm.

A new envelope (submit's first attempt, a re-dispatch's next one) and a re-armed one start from the same columns:
the model's defaults, so a field added to ``DispatchEnvelope`` later is filled the same way everywhere. What
differs is named by the writer: its job, attempt, domain, queue and when it is due.
"""

from __future__ import annotations

from functools import cache

from django.db import connection
from django.db.models import NOT_PROVIDED

from dispatch_app.models import DispatchEnvelope

# What every writer of a new envelope names itself; the rest is the builder's.
NAMED = frozenset({"job_id", "attempt", "domain", "queue", "available_at"})


def model_defaults(model, named) -> tuple[list[str], list]:
    """Columns a write fills with the model's Python defaults (fields with a db_default are left to it)."""
    columns, values = [], []
    for field in model._meta.concrete_fields:
        if field.primary_key or field.attname in named or field.db_default is not NOT_PROVIDED:
            continue
        default = field.get_default()
        if default is None and field.null:
            continue
        columns.append(field.column)
        values.append(field.get_db_prep_save(default, connection))
    return columns, values


@cache
def fresh_columns() -> tuple[tuple[str, ...], tuple]:
    """(columns, values) of a new envelope beyond what its writer names: status pending, no send yet, no error."""
    columns, values = model_defaults(DispatchEnvelope, NAMED)
    return tuple(columns), tuple(values)


def fresh_params() -> dict:
    """``fresh_columns`` as named parameters (``%(fresh_<column>)s``) for a statement's INSERT or SET."""
    columns, values = fresh_columns()
    return {f"fresh_{column}": value for column, value in zip(columns, values, strict=True)}


def fresh_insert() -> tuple[str, str]:
    """(", col, ...", ", %(fresh_col)s, ...") to append to an INSERT's columns and values."""
    columns, _ = fresh_columns()
    return "".join(f", {c}" for c in columns), "".join(f", %(fresh_{c})s" for c in columns)


def fresh_set(keep: tuple[str, ...] = ()) -> str:
    """ "col = %(fresh_col)s, ..." for an UPDATE making an envelope new again, but for the columns in ``keep``.

    A nullable column with no default (the lease, the send's time) is set back to NULL; one with a database
    default (created_at) keeps its value: the envelope is the same row, made sendable again.
    """
    columns, _ = fresh_columns()
    sets = []
    for field in DispatchEnvelope._meta.concrete_fields:
        column = field.column
        if field.primary_key or field.attname in NAMED or column in keep or field.db_default is not NOT_PROVIDED:
            continue
        sets.append(f"{column} = %(fresh_{column})s" if column in columns else f"{column} = NULL")
    return ", ".join(sets)
