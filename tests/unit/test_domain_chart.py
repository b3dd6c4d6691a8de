"""The per-domain charts: failures on their own scale (not a sliver beside thousands of jobs), a y scale and a
time axis on every panel."""

import re

from dispatch_app.views.chart import domain_charts_svg


def point(ago, dispatched=0, finished=0, failed=0):
    return {
        "minutes_ago": ago,
        "dispatched": dispatched,
        "finished": finished,
        "failed": failed,
        "outbox_p95": None,
        "rq_p95": None,
    }


def test_two_failures_beside_a_thousand_jobs_fill_their_own_panel():
    series = [point(ago, dispatched=1000, finished=1000) for ago in range(59, 0, -1)] + [point(0, 1000, 998, 2)]
    svg = str(domain_charts_svg(series, "delivery"))
    panels = svg.split("</svg>")[:-1]
    assert len(panels) == 3
    failed = panels[1]
    assert "failed or outcome_unknown per minute (own scale)" in failed
    (bar,) = re.findall(r'<rect [^>]*height="([\d.]+)" fill="#ba2121"', failed)
    plot_h = 74 - 2 * 6 - 10
    assert float(bar) == plot_h  # the top of its own scale
    assert ">2</text>" in failed  # its y scale says 2, not 1000
    for panel in panels:
        assert ">-60 min</text>" in panel and ">now</text>" in panel
