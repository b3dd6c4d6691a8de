"""The dispatcher's settings: one namespaced dict, ``settings.DISPATCH``.

Read lazily through ``dispatch_settings()`` so ``override_settings`` works in
tests. Every key has a documented default (README, "Settings"); a bad value is a
clear ``ImproperlyConfigured`` naming the key, raised at start-up by the app's
system check and by every command that reads it.

This module is a leaf of the import graph (tests/unit/test_import_layers.py): it
imports nothing of dispatch_app but ``values``. A dict setting whose keys name
things of higher layers (``RECOVERY`` names domains) is checked by a validator
its owner registers at app start-up (``register_validator``, from
``DispatchAppConfig.ready``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from dispatch_app.config.values import coerce_number

__all__ = [
    "ANNOUNCE_PREFIX",
    "NOTIFY_CHANNEL",
    "SPECS",
    "DispatchSettings",
    "cached_settings",
    "check_lease",
    "coerce_number",
    "dispatch_settings",
    "register_validator",
    "validate",
]

# Versioned so the SQL trigger and the listener can evolve together.
NOTIFY_CHANNEL = "productflow_dispatch_v1"
# A NOTIFY payload naming envelopes starts with this (store.triggers.notify.NOTIFY_INSERTED writes it,
# dispatch.announced reads it).
ANNOUNCE_PREFIX = "+"


@dataclass(frozen=True)
class _Spec:
    default: Any
    kind: type
    minimum: float | None = None
    maximum: float | None = None
    doc: str = ""


SPECS: dict[str, _Spec] = {
    "BATCH_SIZE": _Spec(100, int, 1, 10_000, "envelopes claimed per dispatch batch"),
    "SEND_CONCURRENCY": _Spec(4, int, 1, 256, "sends in flight at once (threads)"),
    "SEND_CHUNK_SIZE": _Spec(50, int, 1, 10_000, "envelopes per Redis pipeline in one send"),
    # Workers (dispatch_app.rq.worker, manage.py runworkers).
    "WORKER_PREFETCH": _Spec(8, int, 1, 1000, "ready jobs a worker takes per dequeue round trip (1 = one at a time)"),
    "RECOVERY_LANE_EVERY": _Spec(
        10,
        int,
        2,
        1000,
        "a worker whose new lanes never run dry still takes one job in this many from the recovery lanes "
        "(dispatch_app.domains.lanes): recovered work's guaranteed share under saturation",
    ),
    "WORKER_HEARTBEAT_INTERVAL": _Spec(
        10.0, float, 0.1, 600, "worker heartbeat period (s); a worker silent for 6 periods (min 3 s) counts as dead"
    ),
    "WORKER_DB_CHECK_INTERVAL": _Spec(
        5.0,
        float,
        0,
        3600,
        "a worker and the dispatch loop health-check their PostgreSQL connection after an error or this long idle (s)",
    ),
    "WORKER_DB_OUTAGE_WAIT": _Spec(
        15.0,
        float,
        0,
        3600,
        "how long a worker retries, on fresh connections with backoff, a taken job's start and the saves of what "
        "already happened (an outcome, a vendor call's record or answer) while PostgreSQL is unreachable (s; "
        "0: one retry at once)",
    ),
    "POLL_INTERVAL": _Spec(1.0, float, 0.01, 3600, "fallback tick in seconds when no NOTIFY arrives"),
    "LEASE_SECONDS": _Spec(30.0, float, 1, 86_400, "visibility timeout of a claimed envelope"),
    "MAX_SEND_ATTEMPTS": _Spec(8, int, 1, 1000, "failed sends before an envelope is dead"),
    "SEND_BACKOFF_BASE": _Spec(1.0, float, 0, 3600, "first retry delay after a failed send (s), doubled each time"),
    "SEND_BACKOFF_MAX": _Spec(300.0, float, 0, 86_400, "cap of the retry delay (s)"),
    "SEND_TRANSIENT_BACKOFF_MAX": _Spec(
        10.0,
        float,
        0,
        3600,
        "cap of the probe interval while dispatch is paused because Redis as a whole refuses "
        "(unreachable, OOM, READONLY, ...; such failures never count toward MAX_SEND_ATTEMPTS)",
    ),
    "SHUTDOWN_DEADLINE": _Spec(10.0, float, 0.1, 3600, "seconds to finish in-flight work on SIGTERM"),
    "LISTEN_TIMEOUT": _Spec(5.0, float, 0.05, 3600, "listener wait before it pings the idle connection (s)"),
    # Every process polls a server that is away at most this often; 30 s here meant work waiting up to 30 s
    # after PostgreSQL or Redis was back, for a connection attempt every few seconds saved.
    "RECONNECT_BACKOFF_MAX": _Spec(
        5.0, float, 0.01, 3600, "cap of the reconnect backoff of the listener, the loops and the workers (s)"
    ),
    "LISTEN_DEAD_AFTER": _Spec(
        15.0, float, 1, 3600, "a LISTEN connection whose network stays silent this long is dropped and redone (s)"
    ),
    "NOTIFY_ARM_LEASE": _Spec(
        10.0,
        float,
        1,
        86_400,
        "an idle dispatcher's arm (writers NOTIFY while armed) lasts this long unrenewed, "
        "at least 3 x POLL_INTERVAL (s)",
    ),
    "PREPARED_STATEMENTS": _Spec(
        True,
        bool,
        doc="run the per-job statements (claim, mark, submit, start, finish, vendor-call records) as server-side "
        "prepared statements; set False behind PgBouncer in transaction mode older than 1.21 "
        "(dispatch_app.db.prepared)",
    ),
    "SEND_ANNOUNCED": _Spec(
        True,
        bool,
        doc="an idle dispatcher sends the envelopes a small insert names in its NOTIFY before claiming them, "
        "taking the claim's round trip off the job's path; False claims first (dispatch_app.dispatch.announced)",
    ),
    "MARK_AHEAD_DELAY": _Spec(
        0.1,
        float,
        0,
        1,
        "how long envelopes sent ahead of their claim wait to be marked dispatched together, so one statement marks "
        "every envelope sent meanwhile; 0 marks each drain's at once (s; dispatch_app.dispatch.announced)",
    ),
    "SUBMIT_SENDS": _Spec(
        False,
        bool,
        doc="a submit of up to 8 jobs due now sends their envelopes to RQ itself, right after its commit: no "
        "dispatcher hop and no NOTIFY, and the worker's start marks the envelope dispatched "
        "(dispatch_app.dispatch.writer_send); False leaves every envelope to the dispatcher",
    ),
    "SUBMIT_SEND_GRACE": _Spec(
        2.0,
        float,
        0.1,
        60,
        "how long the dispatcher leaves an envelope to the writer that sends it (SUBMIT_SENDS) before it claims and "
        "sends it itself: the extra wait of a job whose writer died or could not reach Redis after its commit (s)",
    ),
    "PAYLOAD_MAX_BYTES": _Spec(65_536, int, 16, 16 * 1024 * 1024, "largest accepted JSON payload, encoded"),
    "RQ_JOB_TIMEOUT": _Spec(600, int, 1, 86_400, "RQ job timeout (s)"),
    "RQ_RESULT_TTL": _Spec(86_400, int, 1, 30 * 86_400, "how long RQ keeps a job hash (also the duplicate guard)"),
    "PROVIDER_LATENCY_MS": _Spec(0.0, float, 0, 600_000, "the local provider's simulated latency"),
    "PROVIDER_FAILURE_RATE": _Spec(0.0, float, 0, 1, "the local provider's share of failed calls"),
    "PROVIDER_TIMEOUT": _Spec(
        30.0, float, 0.01, 3600, "longest any one vendor call may take (s); past it the call's outcome is unknown"
    ),
    # Recovery's pacing by new work's wait (dispatch_app.recovery.pacing).
    "RECOVERY_PACING": _Spec(
        True,
        bool,
        doc="recovery loops cut their re-dispatches per round while new work's start wait rises above its quietest "
        "(recovery.pacing); False: always the policy's cap",
    ),
    "RECOVERY_PACE_WINDOW": _Spec(
        5.0, float, 0.5, 600, "pacing looks at first attempts dispatched this long ago or less (s)"
    ),
    "RECOVERY_PACE_QUANTILE": _Spec(
        0.99,
        float,
        0.5,
        0.999,
        "pacing reads new work's start wait at this quantile of the window (the tail: where a storm shows first)",
    ),
    "RECOVERY_PACE_TOLERANCE": _Spec(
        1.1, float, 1.0, 100, "new work counts as slowed above its quietest start wait (at that quantile) times this"
    ),
    "RECOVERY_PACE_SLACK_MS": _Spec(
        0.25, float, 0, 60_000, "... plus this (ms), so a few milliseconds of noise are not read as slowed"
    ),
    "RECOVERY_PACE_MIN_SHARE": _Spec(
        0.1,
        float,
        0.0,
        1.0,
        "share of a round's cap recovery keeps re-dispatching however slowed new work is (at least 1 job), "
        "per RECOVERY_PACE_FLOOR_SECONDS or per round when rounds are further apart",
    ),
    "RECOVERY_PACE_FLOOR_SECONDS": _Spec(
        30.0,
        float,
        0.0,
        86_400,
        "the floor (RECOVERY_PACE_MIN_SHARE) is owed once per this many seconds, however often rounds run, and "
        "rounds closer than this regrow their share in proportion beside new work; "
        "0: once per round, regrowth unscaled",
    ),
    "RECOVERY": _Spec(
        {}, dict, doc="per-domain recovery overrides, e.g. {'delivery': {'BATCH_SIZE': 50}} (domains.policy.KEYS)"
    ),
    # Operations (dispatch_app.ops): heartbeats and retention. docs/operations.md explains each.
    "HEARTBEAT_INTERVAL": _Spec(5.0, float, 0.05, 3600, "how often a dispatcher writes its heartbeat row (s)"),
    "HEARTBEAT_STALE_SECONDS": _Spec(
        120.0, float, 1, 86_400, "a process or loop silent for longer is flagged stale (longer than any loop period)"
    ),
    "RETENTION_INTERVAL": _Spec(60.0, float, 0.05, 86_400, "pruning round period, s (< HEARTBEAT_STALE_SECONDS)"),
    "RETENTION_BATCH_SIZE": _Spec(1000, int, 1, 100_000, "rows deleted per pruning transaction"),
    "RETENTION_MAX_BATCHES": _Spec(20, int, 1, 10_000, "pruning transactions per table per round (the bound)"),
    "RETENTION_DISPATCHED_ENVELOPES": _Spec(
        7 * 86_400.0, float, 3600, 10 * 365 * 86_400, "keep dispatched envelopes this long after dispatch (s)"
    ),
    "RETENTION_RECOVERY_ROUNDS": _Spec(
        7 * 86_400.0, float, 3600, 10 * 365 * 86_400, "keep recovery-round records this long after they start (s)"
    ),
    "RETENTION_HEARTBEATS": _Spec(
        86_400.0, float, 60, 10 * 365 * 86_400, "forget a dispatcher process this long after it was last seen (s)"
    ),
    # The dashboard's failure alarm (dispatch_app.views.alarms): a red banner per domain.
    "FAILURE_ALARM_RATE": _Spec(
        0.5, float, 0.0, 1.0, "share of a domain's ended jobs failed or outcome_unknown that raises its alarm"
    ),
    "FAILURE_ALARM_WINDOW": _Spec(300.0, float, 10, 86_400, "the failure alarm's window (s)"),
    "FAILURE_ALARM_MIN_ENDED": _Spec(
        5, int, 1, 1_000_000, "jobs that must have ended in the window before the failure alarm can fire"
    ),
    # The dashboard's outbox-age alarm (dispatch_app.views.outbox_alarm): a red banner per domain.
    "OUTBOX_AGE_ALARM_SECONDS": _Spec(
        30.0, float, 1, 86_400, "a domain's oldest due, undispatched envelope waiting longer raises its alarm (s)"
    ),
    # Each section of the dashboard reads PostgreSQL under this statement timeout (dispatch_app.views.sections).
    "DASHBOARD_STATEMENT_TIMEOUT": _Spec(
        5.0, float, 0.01, 300, "longest one dashboard section may wait on PostgreSQL before it reads unreadable (s)"
    ),
}


@dataclass(frozen=True)
class DispatchSettings:
    BATCH_SIZE: int
    SEND_CONCURRENCY: int
    SEND_CHUNK_SIZE: int
    WORKER_PREFETCH: int
    RECOVERY_LANE_EVERY: int
    WORKER_HEARTBEAT_INTERVAL: float
    WORKER_DB_CHECK_INTERVAL: float
    WORKER_DB_OUTAGE_WAIT: float
    POLL_INTERVAL: float
    LEASE_SECONDS: float
    MAX_SEND_ATTEMPTS: int
    SEND_BACKOFF_BASE: float
    SEND_BACKOFF_MAX: float
    SEND_TRANSIENT_BACKOFF_MAX: float
    SHUTDOWN_DEADLINE: float
    LISTEN_TIMEOUT: float
    RECONNECT_BACKOFF_MAX: float
    LISTEN_DEAD_AFTER: float
    NOTIFY_ARM_LEASE: float
    PREPARED_STATEMENTS: bool
    SEND_ANNOUNCED: bool
    MARK_AHEAD_DELAY: float
    SUBMIT_SENDS: bool
    SUBMIT_SEND_GRACE: float
    PAYLOAD_MAX_BYTES: int
    RQ_JOB_TIMEOUT: int
    RQ_RESULT_TTL: int
    PROVIDER_LATENCY_MS: float
    PROVIDER_FAILURE_RATE: float
    PROVIDER_TIMEOUT: float
    RECOVERY_PACING: bool
    RECOVERY_PACE_WINDOW: float
    RECOVERY_PACE_QUANTILE: float
    RECOVERY_PACE_TOLERANCE: float
    RECOVERY_PACE_SLACK_MS: float
    RECOVERY_PACE_MIN_SHARE: float
    RECOVERY_PACE_FLOOR_SECONDS: float
    RECOVERY: dict
    HEARTBEAT_INTERVAL: float
    HEARTBEAT_STALE_SECONDS: float
    RETENTION_INTERVAL: float
    RETENTION_BATCH_SIZE: int
    RETENTION_MAX_BATCHES: int
    RETENTION_DISPATCHED_ENVELOPES: float
    RETENTION_RECOVERY_ROUNDS: float
    RETENTION_HEARTBEATS: float
    FAILURE_ALARM_RATE: float
    FAILURE_ALARM_WINDOW: float
    FAILURE_ALARM_MIN_ENDED: int
    OUTBOX_AGE_ALARM_SECONDS: float
    DASHBOARD_STATEMENT_TIMEOUT: float


# Dict settings' validators, by key: {key: validate(raw) -> the clean value}. Filled at app start-up.
_VALIDATORS: dict[str, Callable[[Any], Any]] = {}


def register_validator(key: str, check: Callable[[Any], Any]) -> None:
    """Let ``check`` validate (and return the clean value of) the dict setting ``DISPATCH[key]``.

    ``DispatchAppConfig.ready`` registers ``domains.policy.validate_overrides`` for ``RECOVERY``: it reads
    the domain registry, which this module may not import.
    """
    if key not in SPECS or SPECS[key].kind is not dict:
        raise ValueError(f"DISPATCH[{key!r}] is not a dict setting")
    _VALIDATORS[key] = check
    cached_settings.cache_clear()


def _coerce(key: str, value: Any, spec: _Spec) -> Any:
    where = f"DISPATCH[{key!r}]"
    if spec.kind is bool:
        if not isinstance(value, bool):
            raise ImproperlyConfigured(f"{where} must be True or False, got {value!r}")
        return value
    if spec.kind is dict:
        if not isinstance(value, dict):
            raise ImproperlyConfigured(f"{where} must be a dict, got {type(value).__name__}")
        check = _VALIDATORS.get(key)
        return check(value) if check is not None else value
    return coerce_number(where, value, spec.kind, spec.minimum, spec.maximum)


def validate(raw: dict | None) -> DispatchSettings:
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"DISPATCH must be a dict, got {type(raw).__name__}")
    for key in raw:
        if key not in SPECS:
            close = difflib.get_close_matches(str(key), SPECS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(SPECS)}"
            raise ImproperlyConfigured(f"DISPATCH[{key!r}] is not a setting{hint}")
    values = {key: _coerce(key, raw.get(key, spec.default), spec) for key, spec in SPECS.items()}
    if values["SEND_BACKOFF_MAX"] < values["SEND_BACKOFF_BASE"]:
        raise ImproperlyConfigured("DISPATCH['SEND_BACKOFF_MAX'] must be >= DISPATCH['SEND_BACKOFF_BASE']")
    return DispatchSettings(**values)


def check_lease(
    conf: DispatchSettings, *, socket_timeout: float | None, attempts: int = 1, retry_wait: float = 0.0
) -> float:
    """LEASE_SECONDS must outlast the worst case of one batch's sends; returns that worst case (s).

    A send that outlives its lease is re-claimed and re-sent by another
    dispatcher while it is still in flight. The worst case: every chunk's one
    round trip waits out the socket timeout, on each of redis-py's ``attempts``
    (with ``retry_wait`` of backoff between them), and the batch's chunks go
    out in waves of SEND_CONCURRENCY, each waiting for a slot. (A refusing or
    unreachable Redis stops the batch's remaining chunks at the first failure.)
    """
    chunks = math.ceil(conf.BATCH_SIZE / conf.SEND_CHUNK_SIZE)
    waves = math.ceil(chunks / conf.SEND_CONCURRENCY)
    if socket_timeout is None:
        raise ImproperlyConfigured(
            "Redis calls have no timeout (REDIS_SOCKET_TIMEOUT, or socket_timeout in REDIS_URL): "
            "a send could outlast any DISPATCH['LEASE_SECONDS']"
        )
    worst = waves * (attempts * socket_timeout + retry_wait)
    if conf.LEASE_SECONDS <= worst:
        raise ImproperlyConfigured(
            f"DISPATCH['LEASE_SECONDS'] = {conf.LEASE_SECONDS:g}s does not outlast the worst case of a batch's sends, "
            f"{worst:g}s: REDIS_SOCKET_TIMEOUT {socket_timeout:g}s x {attempts} attempt(s) (redis-py retries) "
            f"+ {retry_wait:g}s retry backoff, x {waves} wave(s) of DISPATCH['SEND_CONCURRENCY'] = "
            f"{conf.SEND_CONCURRENCY} for {chunks} chunk(s) (BATCH_SIZE {conf.BATCH_SIZE} / SEND_CHUNK_SIZE "
            f"{conf.SEND_CHUNK_SIZE}). Raise LEASE_SECONDS or lower REDIS_SOCKET_TIMEOUT (socket_timeout in REDIS_URL)."
        )
    return worst


def dispatch_settings(**overrides: Any) -> DispatchSettings:
    """The validated settings, with command-line overrides applied on top."""
    raw = dict(getattr(settings, "DISPATCH", {}) or {})
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return validate(raw)


@cache
def cached_settings() -> DispatchSettings:
    """``dispatch_settings()`` once per process for per-job paths (validating every key costs more than they do).

    Forgotten when ``override_settings`` changes ``DISPATCH`` and when a validator is registered."""
    return dispatch_settings()


def _forget_cached(setting, **kwargs) -> None:
    if setting == "DISPATCH":
        cached_settings.cache_clear()


setting_changed.connect(_forget_cached, dispatch_uid="dispatch_app.config.settings.cached_settings")


assert {f.name for f in fields(DispatchSettings)} == set(SPECS)
