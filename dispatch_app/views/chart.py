"""A small server-rendered SVG chart (no JavaScript, no CDN): dispatched per minute and p95 outbox wait."""

from __future__ import annotations

from django.utils.html import escape
from django.utils.safestring import mark_safe


def throughput_svg(series: list[dict], *, width: int = 600, height: int = 140) -> str:
    pad_left, pad_bottom, pad_top = 40, 18, 10
    plot_w, plot_h = width - pad_left - 40, height - pad_bottom - pad_top
    n = max(len(series), 1)
    bar_w = plot_w / n
    top = max([p["dispatched"] for p in series] + [1])
    p95s = [p["p95"] for p in series if p["p95"] is not None]
    top_p95 = max(p95s + [0.001])
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pf-chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="dispatched per minute, last {n} minutes">',
        f'<text x="2" y="{pad_top + 8}" font-size="10" fill="#555">{top}</text>',
        f'<text x="2" y="{pad_top + plot_h}" font-size="10" fill="#555">0</text>',
        f'<text x="{width - 38}" y="{pad_top + 8}" font-size="10" fill="#b35">{escape(_fmt(top_p95))}</text>',
        f'<line x1="{pad_left}" y1="{pad_top + plot_h}" x2="{pad_left + plot_w}" y2="{pad_top + plot_h}" '
        'stroke="#999" stroke-width="1"/>',
    ]
    points = []
    for i, point in enumerate(series):
        x = pad_left + i * bar_w
        h = plot_h * point["dispatched"] / top
        if point["dispatched"]:
            parts.append(
                f'<rect x="{x:.1f}" y="{pad_top + plot_h - h:.1f}" width="{max(bar_w - 1, 1):.1f}" '
                f'height="{h:.1f}" fill="#417690"><title>{point["minutes_ago"]} min ago: '
                f"{point['dispatched']} dispatched</title></rect>"
            )
        if point["p95"] is not None:
            y = pad_top + plot_h - plot_h * point["p95"] / top_p95
            points.append(f"{x + bar_w / 2:.1f},{y:.1f}")
    if points:
        parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#b35" stroke-width="1.5"/>')
    parts.append(
        f'<text x="{pad_left}" y="{height - 3}" font-size="10" fill="#555">-{n} min</text>'
        f'<text x="{pad_left + plot_w - 20}" y="{height - 3}" font-size="10" fill="#555">now</text>'
    )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - only numbers and escaped text are interpolated


def _fmt(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def domain_charts_svg(series: list[dict], domain: str, *, width: int = 300, height: int = 74) -> str:
    """Three small panels for one domain over the series' minutes: counts (dispatched bars, finished line),
    failures on their own scale (a handful of failures next to thousands of jobs must not be a sliver), and
    waits (p95 outbox and p95 RQ queue per dispatch minute). Each has its y scale and a time axis."""
    return mark_safe(  # noqa: S308 - numbers and escaped text only
        _panel(
            series,
            f"{domain}: dispatched (bars) and finished (line) per minute",
            bars=[("dispatched", "#417690")],
            lines=[("finished", "#2a2")],
            width=width,
            height=height,
            unit="",
        )
        + _panel(
            series,
            f"{domain}: failed or outcome_unknown per minute (own scale)",
            bars=[("failed", "#ba2121")],
            width=width // 2,
            height=height,
            unit="",
        )
        + _panel(
            series,
            f"{domain}: p95 outbox wait (orange) and p95 RQ-queue wait (purple) per minute",
            lines=[("outbox_p95", "#d80"), ("rq_p95", "#739")],
            width=width,
            height=height,
            unit="s",
        )
    )


def _panel(series, label, *, bars=(), overlay_bars=(), lines=(), width, height, unit) -> str:
    pad_left, pad_right, pad_y, axis = 34, 4, 6, 10  # axis: room under the plot for the time labels
    plot_w, plot_h = width - pad_left - pad_right, height - 2 * pad_y - axis
    n = max(len(series), 1)
    step = plot_w / n
    keys = [k for k, _ in (*bars, *overlay_bars, *lines)]
    values = [p[k] for p in series for k in keys if p.get(k) is not None]
    top = max(values + [0]) or 1
    base = pad_y + plot_h
    top_label = _fmt(top) if unit == "s" else str(round(top))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pf-chart pf-mini" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}"><title>{escape(label)}</title>',
        f'<text x="1" y="{pad_y + 8}" font-size="9" fill="#555">{escape(top_label)}</text>',
        f'<text x="1" y="{base}" font-size="9" fill="#555">0</text>',
        f'<line x1="{pad_left}" y1="{base}" x2="{pad_left + plot_w}" y2="{base}" stroke="#bbb" stroke-width="1"/>',
    ]
    for key, color in (*bars, *overlay_bars):
        for i, p in enumerate(series):
            v = p.get(key) or 0
            if v:
                h = max(plot_h * v / top, 1)
                parts.append(
                    f'<rect x="{pad_left + i * step:.1f}" y="{base - h:.1f}" width="{max(step - 0.5, 0.5):.1f}" '
                    f'height="{h:.1f}" fill="{color}"><title>{p["minutes_ago"]} min ago: {v} {key}</title></rect>'
                )
    for key, color in lines:
        points = [
            f"{pad_left + i * step + step / 2:.1f},{base - plot_h * p[key] / top:.1f}"
            for i, p in enumerate(series)
            if p.get(key) is not None
        ]
        if len(points) == 1:
            x, y = points[0].split(",")
            parts.append(f'<circle cx="{x}" cy="{y}" r="1.5" fill="{color}"/>')
        elif points:
            parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" stroke-width="1.2"/>')
    minutes = len(series)
    parts.append(
        f'<text x="{pad_left}" y="{height - 2}" font-size="9" fill="#555">-{minutes} min</text>'
        f'<text x="{pad_left + plot_w}" y="{height - 2}" font-size="9" fill="#555" text-anchor="end">now</text>'
    )
    parts.append("</svg>")
    return "".join(parts)
