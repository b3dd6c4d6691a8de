"""``manage.py dispatchstats [--json]``: the dashboard's numbers in the terminal (dispatch_app.ops.stats)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from dispatch_app.models import ACTIVE_STATUSES
from dispatch_app.ops import stats
from dispatch_app.ops.timeline import format_duration as fmt


def _pcts(latency: dict) -> str:
    if not latency["count"]:
        return "-"
    return "/".join(fmt(latency[k]) for k in ("p50", "p95", "p99"))


def render(snap: dict) -> str:
    lines = [f"database clock {snap['generated_at']}  NOTIFY queue usage {snap['notification_queue_usage']}", ""]
    head = (
        f"{'domain':<13}"
        + "".join(f"{s:>10}" for s in ACTIVE_STATUSES)
        + f"{'pend/due/dead':>15}{'oldest env':>12}{'oldest cand':>12}{'rate 1h':>9}"
    )
    lines.append(head)
    rows = [*snap["domains"].items(), ("TOTAL", None)]
    for domain, d in rows:
        if d is None:
            t = snap["totals"]
            env = t["envelopes"]
            lines.append(
                f"{domain:<13}"
                + "".join(f"{t['backlog'][s]:>10}" for s in ACTIVE_STATUSES)
                + f"{env['pending']}/{env['due']}/{env['dead']:>}".rjust(15)
                + f"{fmt(t['oldest_pending_age']):>12}"
            )
            continue
        env, rate = d["envelopes"], d["recovery"]["effective_rate"]
        lines.append(
            f"{domain:<13}"
            + "".join(f"{d['backlog'][s]:>10}" for s in ACTIVE_STATUSES)
            + f"{env['pending']}/{env['due']}/{env['dead']}".rjust(15)
            + f"{fmt(env['oldest_pending_age']):>12}{fmt(d['oldest_candidate_age']):>12}"
            + ("-" if rate is None else f"{rate * 100:.0f}%").rjust(9)
        )
    lines += ["", "dispatch latency p50/p95/p99 (n)"]
    lines.append(f"{'domain':<13}{'outbox 5m':>28}{'outbox 60m':>28}{'RQ queue 5m':>28}{'RQ queue 60m':>28}")
    for domain in ("all", *snap["domains"]):
        lat = snap["totals"]["latency"] if domain == "all" else snap["domains"][domain]["latency"]
        cells = []
        for stage in ("submitted_to_dispatched", "dispatched_to_started"):
            for window in ("5m", "60m"):
                value = lat[window][stage]
                cells.append(f"{_pcts(value)} ({value['count']})")
        lines.append(f"{domain:<13}" + "".join(f"{c:>28}" for c in (cells[0], cells[1], cells[2], cells[3])))
    lines += ["", "last recovery rounds"]
    for domain, d in snap["domains"].items():
        for r in d["recovery"]["rounds"]:
            lines.append(
                f"  {domain:<13} {fmt(r['age'])} ago  scanned {r['scanned']}  effective {r['effective']}  "
                f"has_more {'yes' if r['has_more'] else 'no'}" + (f"  error {r['error']}" if r["error"] else "")
            )
    lines += ["", "dispatchers"]
    if not snap["dispatchers"]:
        lines.append("  none running")
    for p in snap["dispatchers"]:
        stale = "  STALE" if p["stale"] else ""
        lines.append(f"  {p['name']}  up {fmt(p['uptime'])}  seen {fmt(p['last_seen_age'])} ago{stale}")
        for loop in p["loops"]:
            flag = "  STALE" if loop["stale"] else ""
            lines.append(f"    {loop['loop']:<24} tick {fmt(loop['last_tick_age'])} ago  errors {loop['errors']}{flag}")
    return "\n".join(lines)


class Command(BaseCommand):
    help = "Print the dispatch dashboard's numbers: backlog, ages, recovery rounds, latency percentiles, dispatchers."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="machine-readable output (the same numbers)")

    def handle(self, *args, **options):
        snap = stats.snapshot()
        if options["json"]:
            self.stdout.write(json.dumps(snap, indent=2, sort_keys=True))
        else:
            self.stdout.write(render(snap))
