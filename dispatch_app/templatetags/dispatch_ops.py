"""Small filters for the dispatch pages. One time format everywhere: durations by ``format_duration``
("850 ms", "12.3 s", "4.5 min", "2.0 h"), ages as "<duration> ago", instants as "YYYY-MM-DD HH:MM:SS UTC"
(``utc``), with milliseconds where stages are that short (``utc:"ms"``, the timeline)."""

import math
from datetime import UTC, datetime

from django import template

from dispatch_app.recovery.event_kinds import COUNT_EVENTS
from dispatch_app.views.timeline import format_duration

register = template.Library()


@register.filter
def get(mapping, key):
    return (mapping or {}).get(key)


def _number(value) -> float | None:
    """A template's missing key resolves to "" (string_if_invalid); a row of a domain nobody reads (Redis down,
    an unregistered domain) is full of them. Every filter here reads them as unknown, never as an error."""
    if value is None or isinstance(value, (str, bool)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@register.filter
def seconds(value):
    return format_duration(value)


@register.filter
def ago(value):
    if value is None or value == "":
        return "never"
    return f"{format_duration(value)} ago"


@register.filter
def in_seconds(value):
    """Seconds from now to a moment: "in 12.0 s" ahead, "12.0 s ago" behind, "–" unknown."""
    from dispatch_app.views.blockers import in_seconds as relative

    return relative(_number(value))


@register.filter
def from_now(value, now):
    """An instant relative to ``now`` (both datetimes): "in 12.0 s" ahead, "12.0 s ago" behind."""
    if not isinstance(value, datetime) or not isinstance(now, datetime):
        return "–"
    return in_seconds((value - now).total_seconds())


@register.filter
def utc(value, precision: str = ""):
    """An instant (datetime or ISO string) in UTC, to the second, or to the millisecond with ``"ms"``."""
    if not value:
        return "–"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    if precision == "ms":
        return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d} UTC"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


@register.filter
def percent(value):
    number = _number(value)
    return "–" if number is None else f"{number * 100:.0f}%"


@register.filter
def usage(value):
    """A 0..1 fraction as a percentage that stays readable when tiny (NOTIFY queue usage)."""
    number = _number(value)
    if number is None:
        return "–"
    pct = number * 100
    if pct == 0:
        return "0%"
    return "< 0.01%" if pct < 0.01 else f"{pct:.2f}%"


@register.filter
def pcts(latency):
    if not isinstance(latency, dict) or not latency.get("count"):
        return "–"
    return " / ".join(format_duration(latency[k]) for k in ("p50", "p95", "p99")) + f" (n={latency['count']})"


@register.filter
def rq_job(rq_id):
    """The job id of an RQ id ``pf-<job>-<attempt>``, or None."""
    from dispatch_app.rq.ids import parse_rq_job_id

    parsed = parse_rq_job_id(rq_id or "")
    return parsed[0] if parsed else None


@register.filter
def decisions(recovery_round):
    """(kind, count) pairs of one round, in the dashboard's column order (each links to RecoveryDecisionFilter)."""
    return [(kind, (recovery_round or {}).get(kind) or 0) for kind in COUNT_EVENTS]
