"""What a business domain is: a queue, a payload schema, a task and a recovery policy.

Nothing here imports Django: a project declares its domains in plain modules
(``dispatch_app.domains.registry`` loads them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class PayloadError(ValueError):
    """A payload does not match its domain's schema; the message names the field."""


_SHOWN = 40


def shown(value: Any) -> str:
    """A payload's value as a message echoes it: cut to a short prefix with its length (a key may be 1 MB long).

    The same rule as ``dispatch_app.outbox.payloads.shown``, here without Django (see the module's docstring).
    """
    if isinstance(value, str) and len(value) > _SHOWN:
        return f"{value[:_SHOWN]!r}... ({len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"  # its decimal text may be thousands of digits (or refused)
    return repr(value) if isinstance(value, (str, int, float, type(None))) else f"a {type(value).__name__}"


@dataclass(frozen=True)
class Field:
    kind: type | tuple[type, ...]
    required: bool = True
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None
    item_kind: type | None = None
    length: int | None = None

    def check(self, where: str, value: Any) -> None:
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        # bool is an int in Python; a JSON `true` is never a count.
        if isinstance(value, bool) and bool not in kinds:
            raise PayloadError(f"{where}: expected {_kind_name(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise PayloadError(f"{where}: expected {_kind_name(kinds)}, got {type(value).__name__}")
        if self.minimum is not None and isinstance(value, (int, float)) and value < self.minimum:
            raise PayloadError(f"{where}: must be >= {self.minimum}, got {shown(value)}")
        if self.maximum is not None and isinstance(value, (int, float)) and value > self.maximum:
            raise PayloadError(f"{where}: must be <= {self.maximum}, got {shown(value)}")
        if isinstance(value, (str, list)):
            # The length first: nothing below reads the items of a value that is too long.
            if self.max_length is not None and len(value) > self.max_length:
                raise PayloadError(f"{where}: longer than {self.max_length} (got {len(value)})")
            if isinstance(value, str) and self.required and not value.strip():
                raise PayloadError(f"{where}: must not be empty")
        if isinstance(value, list):
            if self.length is not None and len(value) != self.length:
                raise PayloadError(f"{where}: expected {self.length} items, got {len(value)}")
            if self.required and not value:
                raise PayloadError(f"{where}: must not be empty")
            if self.item_kind is not None:
                for index, item in enumerate(value):
                    Field(self.item_kind).check(f"{where}[{index}]", item)


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", float: "number", list: "list", dict: "object", bool: "boolean"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


# RecoveryPolicy.in_doubt's answers.
RERUN, ASK, CONCLUDE = "rerun", "ask", "outcome_unknown"


@dataclass(frozen=True)
class RecoveryPolicy:
    """How recovery treats this domain's unfinished jobs (see dispatch_app.recovery)."""

    queued_stale_seconds: float = 300.0
    running_stale_seconds: float = 900.0
    max_attempts: int = 3
    # Re-running after an interruption repeats no side effect (or the effect is idempotent).
    retry_safe: bool = False
    # A recorded vendor request id lets recovery ask the provider what happened.
    uses_vendor_request_id: bool = False
    batch_size: int = 25
    period_seconds: float = 30.0
    jitter_seconds: float = 5.0
    # How long a vendor's "pending" (or no answer at all) about a call in doubt is believed, from when
    # the call was recorded (database clock); past it the job is outcome_unknown, never waited on forever.
    vendor_evidence_trust_seconds: float = 600.0
    # The work makes every side effect through ctx.call_vendor (dispatch_app.store.vendor_calls): recovery
    # reasons over that ledger, and a job with no call in doubt can resume safely. Code, not a setting.
    records_vendor_calls: bool = False

    def in_doubt(self, *, askable: bool) -> str:
        """What the next attempt does about a vendor call an interrupted attempt left in doubt.

        The one place this is decided: the worker (``execution.attempt._provider_failed``), the
        ledger (``execution.ledger.Ledger``) and recovery (``recovery.decide``) all ask it.
        ``askable``: the call has a request id the vendor keeps a record of.

        - ``RERUN``: the domain (or task queue) is retry-safe: the call is made again;
        - ``ASK``: the vendor is asked what became of it, and its answer settles it;
        - ``CONCLUDE``: neither: it may have taken effect, so the job is concluded ``outcome_unknown``.
        """
        if self.retry_safe:
            return RERUN
        if askable and self.uses_vendor_request_id:
            return ASK
        return CONCLUDE


# The dotted path RQ stores for a domain whose declaration names no task: the worker's entry point,
# one attribute per domain key (dispatch_app.run.<key>), so RQ jobs keep their (job_id, attempt)
# arguments and a domain module never imports the worker.
DEFAULT_TASK_PREFIX = "dispatch_app.run."


@dataclass(frozen=True)
class Domain:
    key: str
    queue: str
    # Field name -> Field; None accepts any JSON object (a task checks its own arguments).
    schema: dict[str, Field] | None = None
    # The work the shipped worker entry point runs: work(ctx) -> JSON-serialisable result.
    work: Callable[[Any], Any] | None = None
    # Dotted path RQ stores in the job (JSON-serialisable, no pickled callables); called with
    # (job_id, attempt). Empty: the shipped entry point, which runs ``work``.
    task_path: str = ""
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    description: str = ""
    # A check beyond the schema, ``payload_check(domain, payload)`` raising PayloadError: run by ``validate`` at
    # submit and again in the worker (e.g. a task job's path must name a Task on its queue). Not compared: a
    # declaration is the same whatever function object checks it.
    payload_check: Callable[[Any, dict], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        # The shipped entry point runs the domain its path names, so it always names this one (also after
        # dataclasses.replace(domain, key=...), which passes the old key's path along).
        if (not self.task_path or self.task_path.startswith(DEFAULT_TASK_PREFIX)) and isinstance(self.key, str):
            object.__setattr__(self, "task_path", DEFAULT_TASK_PREFIX + self.key)

    def validate(self, payload: Any) -> dict:
        if not isinstance(payload, dict):
            raise PayloadError(f"{self.key}: payload must be a JSON object, got {type(payload).__name__}")
        if self.schema is None:
            return payload
        unknown = [name for name in payload if name not in self.schema]
        if unknown:
            # A few, each cut: the names are the caller's (and, from a browser, as many and as long as it likes).
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            names = ", ".join(
                name if isinstance(name, str) and name.isidentifier() and len(name) <= _SHOWN else shown(name)
                for name in sorted(unknown, key=str)[:3]
            )
            raise PayloadError(f"{self.key}: unknown field(s) {names}{more}; expected {', '.join(sorted(self.schema))}")
        for name, spec in self.schema.items():
            where = f"{self.key}.{name}"
            if name not in payload:
                if spec.required:
                    raise PayloadError(f"{where}: required field is missing")
                continue
            spec.check(where, payload[name])
        if self.payload_check is not None:
            self.payload_check(self, payload)
        return payload
