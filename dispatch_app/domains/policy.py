"""Recovery policy per domain: the domain's defaults, overridden by ``DISPATCH['RECOVERY']``.

Each domain module declares a ``RecoveryPolicy`` next to its task; settings may
override any field per domain::

    DISPATCH = {"RECOVERY": {"delivery": {"BATCH_SIZE": 50, "RUNNING_STALE_SECONDS": 120}}}

A bad value is an ``ImproperlyConfigured`` naming the domain and the key, raised
by ``dispatch_app.config.settings.validate`` (so at start-up, by the system check and by
every command): ``DispatchAppConfig.ready`` registers ``validate_overrides`` with
``conf.register_validator``, as ``conf`` sits below the domain registry and may
not import this module. This module imports no models.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from dispatch_app.config.tuning import RECOVERY_SPREAD_MAX, RECOVERY_SPREAD_SHARE
from dispatch_app.config.values import coerce_number
from dispatch_app.domains import domain_keys, get_domain, is_registered
from dispatch_app.domains.base import RecoveryPolicy


@dataclass(frozen=True)
class _Key:
    field: str
    kind: type
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    doc: str = ""


# Settings key -> RecoveryPolicy field. Defaults come from each domain's module.
KEYS: dict[str, _Key] = {
    "QUEUED_STALE_SECONDS": _Key(
        "queued_stale_seconds", float, 0, 30 * 86_400, doc="a submitted/queued job untouched this long is a candidate"
    ),
    "RUNNING_STALE_SECONDS": _Key(
        "running_stale_seconds", float, 0, 30 * 86_400, doc="a running job untouched this long is a candidate"
    ),
    "MAX_ATTEMPTS": _Key("max_attempts", int, 1, 1000, doc="attempts before recovery fails the job instead"),
    "RETRY_SAFE": _Key("retry_safe", bool, doc="re-running after an interruption repeats no side effect"),
    "USES_VENDOR_REQUEST_ID": _Key(
        "uses_vendor_request_id", bool, doc="ask the provider about the recorded vendor request id"
    ),
    "VENDOR_EVIDENCE_TRUST_SECONDS": _Key(
        "vendor_evidence_trust_seconds",
        float,
        0,
        30 * 86_400,
        doc="how long a vendor's pending (or no answer) about a call in doubt is believed, from when the call was "
        "recorded (database clock); then outcome_unknown",
    ),
    "BATCH_SIZE": _Key("batch_size", int, 1, 10_000, doc="candidates per round (B; B+1 are read to tell has_more)"),
    "MAX_REDISPATCHES_PER_ROUND": _Key(
        "max_redispatches_per_round",
        int,
        0,
        10_000,
        nullable=True,
        doc="re-dispatch rate cap per round (None = the batch size; 0 = report only)",
    ),
    "PERIOD_SECONDS": _Key("period_seconds", float, 0.01, 86_400, doc="pause between two rounds of one domain"),
    "JITTER_SECONDS": _Key("jitter_seconds", float, 0, 86_400, doc="random extra pause, so processes spread out"),
    "SPREAD_SECONDS": _Key(
        "spread_seconds",
        float,
        0,
        86_400,
        nullable=True,
        doc="a recovery loop's round makes its re-dispatches due one step after another over this span (None = 80 % "
        "of PERIOD_SECONDS, at most 30 s; 0 = all due at once; `recover --once` always sends at once)",
    ),
}


@dataclass(frozen=True)
class EffectivePolicy(RecoveryPolicy):
    """A domain's policy after overrides; adds the knobs the domain modules do not declare."""

    domain: str = ""
    max_redispatches_per_round: int | None = None
    spread_seconds: float | None = None

    @property
    def round_spread(self) -> float:
        """Seconds a loop's round spreads its re-dispatches over (``SPREAD_SECONDS``, or from the period)."""
        if self.spread_seconds is not None:
            return self.spread_seconds
        return min(self.period_seconds * RECOVERY_SPREAD_SHARE, RECOVERY_SPREAD_MAX)

    @property
    def redispatch_cap(self) -> int:
        """The batch size bounds the rate cap: one round never re-dispatches more than B."""
        if self.max_redispatches_per_round is None:
            return self.batch_size
        return min(self.max_redispatches_per_round, self.batch_size)

    def stale_seconds(self, status: str) -> float:
        return self.running_stale_seconds if status == "running" else self.queued_stale_seconds


def _coerce(domain: str, key: str, value: Any, spec: _Key) -> Any:
    where = f"DISPATCH['RECOVERY'][{domain!r}][{key!r}]"
    if value is None and spec.nullable:
        return None
    if spec.kind is bool:
        if not isinstance(value, bool):
            raise ImproperlyConfigured(f"{where} must be True or False, got {value!r}")
        return value
    return coerce_number(where, value, spec.kind, spec.minimum, spec.maximum)


def _hint(name: str, valid) -> str:
    close = difflib.get_close_matches(str(name), list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(valid)}"


def validate_overrides(raw: Any) -> dict[str, dict[str, Any]]:
    """Check ``DISPATCH['RECOVERY']``; returns {domain: {KEY: coerced value}}."""
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"DISPATCH['RECOVERY'] must be a dict of domain -> overrides, got {raw!r}")
    clean: dict[str, dict[str, Any]] = {}
    for domain, overrides in raw.items():
        if not is_registered(domain):
            keys = domain_keys()
            raise ImproperlyConfigured(
                f"DISPATCH['RECOVERY'][{domain!r}] is not a domain{_hint(domain, keys)}"
                f" (valid domains: {', '.join(keys)})"
            )
        if not isinstance(overrides, dict):
            raise ImproperlyConfigured(
                f"DISPATCH['RECOVERY'][{domain!r}] must be a dict of setting -> value, got {overrides!r}"
            )
        for key in overrides:
            if key not in KEYS:
                where = f"DISPATCH['RECOVERY'][{domain!r}][{key!r}]"
                raise ImproperlyConfigured(f"{where} is not a setting{_hint(key, KEYS)}")
        clean[domain] = {key: _coerce(domain, key, value, KEYS[key]) for key, value in overrides.items()}
    return clean


def resolve(domain: str, recovery_settings: dict | None = None) -> EffectivePolicy:
    """The effective policy of one domain (``recovery_settings`` is ``conf.RECOVERY``)."""
    base = get_domain(domain).recovery
    overrides = validate_overrides(recovery_settings or {}).get(domain, {})
    policy = EffectivePolicy(**{f: getattr(base, f) for f in base.__dataclass_fields__}, domain=domain)
    return replace(policy, **{KEYS[key].field: value for key, value in overrides.items()})


def resolve_all(recovery_settings: dict | None = None) -> dict[str, EffectivePolicy]:
    return {domain: resolve(domain, recovery_settings) for domain in domain_keys()}


def describe(policy: EffectivePolicy) -> dict[str, Any]:
    """The policy as settings keys, for logs and ``recover --json``."""
    return {key: getattr(policy, spec.field) for key, spec in KEYS.items()}
