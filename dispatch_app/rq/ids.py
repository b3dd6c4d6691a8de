"""The RQ job id of an attempt (the one place it is spelled) and the dispatcher's signature on the hash it writes.

An attempt's RQ id is ``pf-<namespace>-<job>-<attempt>``: the deployment's namespace (``dispatch_app.rq.deployment``)
keeps two deployments' ids apart in one Redis database. Ids of the form before namespaces, ``pf-<job>-<attempt>``,
are still read (``PRODUCTFLOW_LEGACY_RQ_IDS``, on by default) so that jobs sent before an upgrade run after it.

The signature (``SIGNATURE_FIELD`` in the job hash) is an HMAC of the id, the entry point and the queue under the
deployment's ``SECRET_KEY``: a hash that lacks it, or carries another, was not written by a dispatcher of this
deployment, whatever its fields say. The dispatcher's send replaces such a hash (``rq.publish``) and the
worker refuses it unrun (``rq.worker.admission``). Anyone can copy a signature from a real hash, but only for
that same attempt, entry point and queue: exactly what the dispatcher would have sent.
"""

from __future__ import annotations

import hmac
import re
from typing import NamedTuple

from django.conf import settings
from django.utils.crypto import salted_hmac

from dispatch_app.rq.deployment import namespace

SIGNATURE_FIELD = "pf_sig"
LEGACY_SETTING = "PRODUCTFLOW_LEGACY_RQ_IDS"
_SALT = "dispatch_app.rq.ids.signature"
_ID = re.compile(r"pf-([A-Za-z0-9_]{1,32})-([0-9]{1,19})-([0-9]{1,19})")
_LEGACY_ID = re.compile(r"pf-([0-9]{1,19})-([0-9]{1,19})")


class ParsedId(NamedTuple):
    namespace: str | None  # None: the legacy form, which names no deployment
    job_id: int
    attempt: int


def rq_job_id(job_id: int, attempt: int, ns: str | None = None) -> str:
    """The RQ id of this deployment's (or ``ns``'s) attempt."""
    return f"pf-{ns or namespace()}-{job_id}-{attempt}"


def legacy_rq_job_id(job_id: int, attempt: int) -> str:
    """The id the same attempt had before namespaces (sent by an earlier release)."""
    return f"pf-{job_id}-{attempt}"


def parse(rq_id: str) -> ParsedId | None:
    """The parts of any id of ours, whichever deployment's; None for an id of no form of ours."""
    if not isinstance(rq_id, str):
        return None
    if m := _ID.fullmatch(rq_id):
        return ParsedId(m[1], int(m[2]), int(m[3]))
    if m := _LEGACY_ID.fullmatch(rq_id):
        return ParsedId(None, int(m[1]), int(m[2]))
    return None


def legacy_accepted() -> bool:
    return bool(getattr(settings, LEGACY_SETTING, True))


def parse_rq_job_id(rq_id: str) -> tuple[int, int] | None:
    """(job id, attempt) of an id of this deployment (or of the legacy form, while accepted); else None."""
    parsed = parse(rq_id)
    if parsed is None:
        return None
    if parsed.namespace is None:
        return (parsed.job_id, parsed.attempt) if legacy_accepted() else None
    return (parsed.job_id, parsed.attempt) if parsed.namespace == namespace() else None


def signature(rq_id: str, func: str, queue: str, secret: str | None = None) -> str:
    value = f"{rq_id}\n{func}\n{queue}"
    return salted_hmac(_SALT, value, secret=secret, algorithm="sha256").hexdigest()[:32]


def signed(rq_id: str, func: str, queue: str, found) -> bool:
    """Whether ``found`` (the hash's field, bytes or str) is the signature under SECRET_KEY or a fallback."""
    if isinstance(found, bytes):
        try:
            found = found.decode("ascii")
        except UnicodeDecodeError:
            return False
    if not isinstance(found, str) or len(found) != 32:
        return False
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    return any(hmac.compare_digest(found, signature(rq_id, func, queue, secret)) for secret in secrets)
