"""What each of ``PipelineWorker``'s mixins needs of the worker it is mixed into, as code: one Protocol per mixin.

A mixin names its contract (``NEEDS``) and its methods annotate ``self`` with it, so a reader (and a type checker)
sees which of the worker's attributes a mixin reads and writes; ``missing`` says which a worker lacks, and
``tests/integration/rq/worker/test_worker_contracts.py`` checks every mixin's contract against a real worker.
"""

from __future__ import annotations

from typing import Any, Protocol


class StartsHost(Protocol):
    """``StartsMixin``: the start writes from RQ's code or a template, per (queue, timeout, busy)."""

    _start_templates: dict
    _timeouts: dict
    _pending: Any
    _fetcher: Any
    _state: Any


class WritesHost(StartsHost, Protocol):
    """``WritesMixin``: the job's end written with the next start (the previous job's end, pending until then)."""

    _pending_fields: dict
    executions: Any


class EvidenceHost(Protocol):
    """``EvidenceMixin``: the outcomes and the jobs it could not read, written into the worker's RQ hash."""

    _recent: Any
    _pending_fields: dict
    _undeserializable: int
    _told_undeserializable: bool
    heartbeat_interval: float

    def _flush_pending(self) -> None: ...

    def _write_fields(self, pipe) -> None: ...


class OutageHost(Protocol):
    """``OutageMixin``: a Redis outage (or a value in Redis it cannot use) waited out instead of exiting."""

    _stopping: Any
    _stop_requested: bool
    _buffer: Any
    _beat: Any
    _fetcher: Any
    _in_doubt: Any
    _pending: Any

    def _drop_held(self, why: str, job_id: str | None = None) -> None: ...


def missing(worker: object, contract: type) -> list[str]:
    """The attributes and methods of ``contract`` (its bases' included) that ``worker`` lacks."""
    names: list[str] = []
    for klass in contract.__mro__:
        if klass in (object, Protocol) or not getattr(klass, "_is_protocol", False):
            continue
        names += list(getattr(klass, "__annotations__", {}))
        names += [n for n, v in vars(klass).items() if callable(v) and not n.startswith("__")]
    return sorted({n for n in names if not hasattr(worker, n)})
