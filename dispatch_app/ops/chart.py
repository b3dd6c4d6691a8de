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
