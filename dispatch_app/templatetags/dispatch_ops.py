"""Small filters for the dispatch dashboard."""

from django import template

from dispatch_app.ops.timeline import format_duration

register = template.Library()


@register.filter
def get(mapping, key):
    return (mapping or {}).get(key)


@register.filter
def seconds(value):
    return format_duration(value)


@register.filter
def percent(value):
    return "–" if value is None else f"{value * 100:.0f}%"


@register.filter
def pcts(latency):
    if not latency or not latency.get("count"):
        return "–"
    return " / ".join(format_duration(latency[k]) for k in ("p50", "p95", "p99")) + f" (n={latency['count']})"
