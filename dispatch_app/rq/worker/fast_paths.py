"""Two of RQ's helpers that a worker calls several times per job, with the same answers for less CPU.

- ``resolve_serializer`` runs in every ``Job``, ``Queue`` and registry
  constructor, and a worker builds several of those per job. Its check,
  ``isinstance(serializer, Serializer)`` against a runtime-checkable Protocol,
  walks the Protocol's attributes twice on every call before Python 3.12: a
  third of the cost of recording a job's start on a slow host. Python 3.12+
  caches the attribute names but still runs the Protocol's ``__instancecheck__``
  (a ``hasattr`` per attribute) on every call -- 3.4 us against 0.06 us for the
  shortcut on Python 3.13 here -- so the shortcut is taken on every version.
  The project's workers always use RQ's ``JSONSerializer``, which passes that
  check, so for it the answer is known; anything else goes to RQ's function.
- ``utcparse`` reads every timestamp of a job hash (``Job.restore``) with
  ``strptime``, ~20 times slower than ``fromisoformat``. A string in exactly the
  layout RQ writes (``utcformat``) is read with ``fromisoformat``; any other
  goes to RQ's function, so what it accepts and refuses does not change.

RQ stays as it is; ``install()`` points the names RQ looks up at these.
"""

from __future__ import annotations

import datetime
import re
import sys

from rq import serializers, utils
from rq.serializers import JSONSerializer

import dispatch_app.rq.internals as rq_internals

# The RQ module globals replaced here are listed (and checked against RQ) in ``dispatch_app.rq.internals``.
SERIALIZER_MODULES = rq_internals.SERIALIZER_MODULES
UTCPARSE_MODULES = rq_internals.UTCPARSE_MODULES

_resolve_serializer = serializers.resolve_serializer
_utcparse = utils.utcparse
_UTC = datetime.UTC
# utcformat's layout (2026-12-02T05:07:40.413979Z), ASCII digits only: exactly what strptime(_TIMESTAMP_FORMAT) reads.
_RQ_LAYOUT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")


def resolve_serializer(serializer=None):
    if serializer is JSONSerializer:
        return serializer
    return _resolve_serializer(serializer)


def utcparse(string: str) -> datetime.datetime:
    if _RQ_LAYOUT.fullmatch(string):
        try:
            return datetime.datetime.fromisoformat(string[:26]).replace(tzinfo=_UTC)
        except ValueError:
            pass
    return _utcparse(string)


def install() -> list[str]:
    """Point RQ's lookups at the fast paths; idempotent. Returns what it changed (``module.name``).

    A name that is no longer RQ's own (someone else replaced it) is left alone.
    """
    changed = []
    plan = [(m, "utcparse", _utcparse, utcparse) for m in UTCPARSE_MODULES]
    plan += [(m, "resolve_serializer", _resolve_serializer, resolve_serializer) for m in SERIALIZER_MODULES]
    for module_name, attr, original, fast in plan:
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, attr, None) is original:
            setattr(module, attr, fast)
            changed.append(f"{module_name}.{attr}")
    return changed
