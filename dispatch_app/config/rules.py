"""Rules between DISPATCH settings, checked at start-up as Django system checks (tag ``productflow``).

``conf.validate`` checks each key on its own (type, range); the rules here are the ones the README
states between two keys. Each message names both settings and their values and says what to change.
An ``Error`` is a combination that breaks a guarantee (a live process shown dead, a send outliving
its lease); a ``Warning`` one the code survives but that is likely a mistake. ``manage.py check``,
``rundispatcher`` and ``runworkers`` run them (an Error stops the command before it starts).

A leaf: imports only Django and ``dispatch_app.config.settings``.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from dispatch_app.config.settings import DispatchSettings, check_lease, dispatch_settings

TAG = "productflow"


def _d(key: str, value) -> str:
    return f"DISPATCH['{key}'] = {value:g}" if isinstance(value, float | int) else f"DISPATCH['{key}'] = {value!r}"


def rule_messages(conf: DispatchSettings, socket_timeout: float | None) -> list[checks.CheckMessage]:
    """Every broken rule of one set of settings; ``socket_timeout``: REDIS_SOCKET_TIMEOUT (None: unknown)."""
    out = _staleness_errors(conf)
    if socket_timeout is not None:
        try:
            check_lease(conf, socket_timeout=socket_timeout)
        except ImproperlyConfigured as exc:
            out.append(
                checks.Error(str(exc), hint="Raise LEASE_SECONDS or lower REDIS_SOCKET_TIMEOUT.", id="productflow.E106")
            )
    return out + _warnings(conf)


def _staleness_errors(conf: DispatchSettings) -> list[checks.CheckMessage]:
    """A loop's heartbeat is its last round: every period must stay below the staleness threshold."""
    out: list[checks.CheckMessage] = []
    stale = conf.HEARTBEAT_STALE_SECONDS
    if conf.RETENTION_INTERVAL >= stale:
        out.append(
            checks.Error(
                f"{_d('RETENTION_INTERVAL', conf.RETENTION_INTERVAL)} is not below "
                f"{_d('HEARTBEAT_STALE_SECONDS', stale)}: the retention loop ticks once per round, so a healthy "
                "one would be flagged stale between rounds.",
                hint="Lower RETENTION_INTERVAL or raise HEARTBEAT_STALE_SECONDS.",
                id="productflow.E101",
            )
        )
    if conf.HEARTBEAT_INTERVAL * 2 > stale:
        out.append(
            checks.Error(
                f"{_d('HEARTBEAT_INTERVAL', conf.HEARTBEAT_INTERVAL)} is more than half of "
                f"{_d('HEARTBEAT_STALE_SECONDS', stale)}: one late heartbeat would show a live dispatcher stale "
                "(and dead to the operator pages).",
                hint="Keep HEARTBEAT_INTERVAL at most half of HEARTBEAT_STALE_SECONDS (the defaults: 5 s and 120 s).",
                id="productflow.E102",
            )
        )
    if conf.POLL_INTERVAL >= stale:
        out.append(
            checks.Error(
                f"{_d('POLL_INTERVAL', conf.POLL_INTERVAL)} is not below {_d('HEARTBEAT_STALE_SECONDS', stale)}: "
                "an idle dispatch loop ticks once per fallback tick, so it would be flagged stale while healthy.",
                hint="Lower POLL_INTERVAL or raise HEARTBEAT_STALE_SECONDS (longer than any loop period).",
                id="productflow.E103",
            )
        )
    for domain, overrides in sorted(conf.RECOVERY.items()):
        period = overrides.get("PERIOD_SECONDS")
        if period is not None and period + overrides.get("JITTER_SECONDS", 0) >= stale:
            out.append(
                checks.Error(
                    f"DISPATCH['RECOVERY']['{domain}']['PERIOD_SECONDS'] = {period:g} (plus its JITTER_SECONDS) is "
                    f"not below {_d('HEARTBEAT_STALE_SECONDS', stale)}: the domain's recovery loop ticks once per "
                    "round, so it would be flagged stale between rounds.",
                    hint="Lower the domain's PERIOD_SECONDS or raise HEARTBEAT_STALE_SECONDS.",
                    id="productflow.E104",
                )
            )
    if conf.RETENTION_HEARTBEATS <= stale:
        out.append(
            checks.Error(
                f"{_d('RETENTION_HEARTBEATS', conf.RETENTION_HEARTBEATS)} is not above "
                f"{_d('HEARTBEAT_STALE_SECONDS', stale)}: a dead dispatcher's heartbeat rows would be deleted "
                "before it is ever shown stale.",
                hint="Raise RETENTION_HEARTBEATS (default one day) well above HEARTBEAT_STALE_SECONDS.",
                id="productflow.E105",
            )
        )
    return out


def _warnings(conf: DispatchSettings) -> list[checks.CheckMessage]:
    out: list[checks.CheckMessage] = []
    if conf.NOTIFY_ARM_LEASE < 3 * conf.POLL_INTERVAL:
        out.append(
            checks.Warning(
                f"{_d('NOTIFY_ARM_LEASE', conf.NOTIFY_ARM_LEASE)} is below 3 x "
                f"{_d('POLL_INTERVAL', conf.POLL_INTERVAL)}: the arm lasts {3 * conf.POLL_INTERVAL:g} s instead.",
                hint="Set NOTIFY_ARM_LEASE to at least 3 x POLL_INTERVAL, or lower POLL_INTERVAL.",
                id="productflow.W101",
            )
        )
    if conf.LISTEN_TIMEOUT >= conf.LISTEN_DEAD_AFTER:
        out.append(
            checks.Warning(
                f"{_d('LISTEN_TIMEOUT', conf.LISTEN_TIMEOUT)} is not below "
                f"{_d('LISTEN_DEAD_AFTER', conf.LISTEN_DEAD_AFTER)}: the idle listener pings only after the "
                "network silence that counts its connection dead.",
                hint="Keep LISTEN_TIMEOUT well below LISTEN_DEAD_AFTER (defaults 5 s and 15 s).",
                id="productflow.W102",
            )
        )
    if conf.SHUTDOWN_DEADLINE >= conf.LEASE_SECONDS:
        out.append(
            checks.Warning(
                f"{_d('SHUTDOWN_DEADLINE', conf.SHUTDOWN_DEADLINE)} is not below "
                f"{_d('LEASE_SECONDS', conf.LEASE_SECONDS)}: a send still in flight at shutdown can outlive its "
                "lease, and another dispatcher may claim and send the envelope again.",
                hint="Keep SHUTDOWN_DEADLINE below LEASE_SECONDS.",
                id="productflow.W103",
            )
        )
    if conf.OUTBOX_AGE_ALARM_SECONDS <= conf.POLL_INTERVAL:
        out.append(
            checks.Warning(
                f"{_d('OUTBOX_AGE_ALARM_SECONDS', conf.OUTBOX_AGE_ALARM_SECONDS)} is not above "
                f"{_d('POLL_INTERVAL', conf.POLL_INTERVAL)}: an envelope that waits for the fallback tick raises "
                "the outbox-age alarm with nothing wrong.",
                hint="Raise OUTBOX_AGE_ALARM_SECONDS well above POLL_INTERVAL.",
                id="productflow.W104",
            )
        )
    return out


def check_settings_rules(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """The system check: the rules over ``settings.DISPATCH`` (a key that is bad on its own is E001's)."""
    try:
        conf = dispatch_settings()
    except ImproperlyConfigured:
        return []
    return rule_messages(conf, getattr(settings, "REDIS_SOCKET_TIMEOUT", None))
