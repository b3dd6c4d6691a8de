"""``manage.py dispatchstats [--json]``: the dashboard's numbers in the terminal (dispatch_app.views.stats).

Every text it prints came from PostgreSQL or Redis (domain names, worker hashes, dispatcher names, errors), and
anyone who can write a worker hash can write terminal escape sequences: the table shows control characters as
escapes (``\\x1b``), never raw (``--json`` escapes them as JSON does).
"""

from __future__ import annotations

import json
import re

from django.core.management.base import BaseCommand

import dispatch_app.views.board as board
from dispatch_app.models import ACTIVE_STATUSES
from dispatch_app.views.timeline import format_duration as fmt

# C0 and C1 controls (ESC, BEL, CSI ...), DEL, and the line/paragraph separators and bidirectional overrides that
# rearrange what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``, ``\\u202e``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def escaped(value):
    """The snapshot with every string in it (keys too) made terminal-safe; numbers and times as they are."""
    if isinstance(value, str):
        return terminal_safe(value)
    if isinstance(value, dict):
        return {escaped(k): escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escaped(v) for v in value]
    return value


def _pcts(latency: dict) -> str:
    if not latency["count"]:
        return "-"
    return "/".join(fmt(latency[k]) for k in ("p50", "p95", "p99"))


def table(rows: list[list[str]], *, indent: str = "") -> list[str]:
    """Columns sized to their widest cell and two spaces apart, so no two ever run together.

    The first column is left-aligned (names), the others right-aligned (numbers).
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent
        + "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]


def queue_usage(value: float | None) -> str:
    """pg_notification_queue_usage() as a percentage with fixed digits (not 0.0000028610229492187)."""
    return "-" if value is None else f"{value * 100:.3f}%"


def in_rq(rq: dict) -> str:
    """Jobs waiting in RQ, split by lane (dispatch_app.domains.lanes): workers take the new ones first."""
    lanes = rq.get("lanes")
    if not lanes:
        return str(rq.get("depth", "-"))
    return "+".join(str(lane["depth"]) for lane in lanes.values())


def rq_side(snap: dict) -> list[str]:
    """The dashboard's alarms, the RQ side and the failures (views.board), when the snapshot has them."""
    if "rq" not in snap:
        return []
    lines = ["", "alarms"]
    for b in snap["banners"]:
        lines.append(f"  {b['level'].upper()}: {b['text']}")
        # A failure alarm's top errors, as on the page (count × the error's first line).
        lines += [f"    {e['count']} × {e['message'] or '(no error recorded)'}" for e in b.get("errors") or ()]
    if not snap["banners"]:
        lines.append("  none")
    if snap["rq"]["error"]:
        lines += ["", f"RQ side: Redis could not be read: {snap['rq']['error']}"]
    rows = [
        [
            "domain",
            "queue",
            "in RQ (new+recovery)",
            "live workers",
            "oldest in RQ",
            "started/min",
            "finished/min",
            "failed 5m/1h",
            "unknown 5m/1h",
            "fail rate 5m/1h",
            "dispatch",
        ]
    ]
    for domain, d in snap["domains"].items():
        rq, f, act = d.get("rq") or {}, d.get("failures") or {}, d.get("activity") or {}
        f5, f60 = f.get("5m") or {}, f.get("60m") or {}

        def rate(x):
            return "-" if x.get("rate") is None else f"{x['rate'] * 100:.0f}%"

        rows.append(
            [
                domain,
                rq.get("queue", "-"),
                in_rq(rq),
                str(rq.get("live_workers", "-")) + (" (!)" if rq.get("live_workers") == 0 and rq.get("depth") else ""),
                fmt(rq.get("oldest_wait")),
                str(act.get("started_per_min", "-")),
                str(act.get("finished_per_min", "-")),
                f"{f5.get('failed', 0)}/{f60.get('failed', 0)}",
                f"{f5.get('outcome_unknown', 0)}/{f60.get('outcome_unknown', 0)}",
                f"{rate(f5)}/{rate(f60)}",
                "PAUSED" if d.get("paused") else "running",
            ]
        )
    return [*lines, "", "RQ side and failures"] + table(rows)


def known(value) -> str:
    """A count, or "-" when its section could not be read (None: unknown, not zero)."""
    return "-" if value is None else str(value)


def latency_section(snap: dict) -> list[str]:
    lines = ["", "dispatch latency per attempt p50/p95/p99 (n); outbox = due -> dispatched, backoff apart"]
    stages = (("submitted_to_dispatched", "outbox"), ("dispatched_to_started", "RQ queue"), ("backoff", "backoff"))
    rows = [["domain", *(f"{name} {window}" for _, name in stages for window in ("5m", "60m"))]]
    for domain in ("all", *snap["domains"]):
        lat = snap["totals"]["latency"] if domain == "all" else snap["domains"][domain]["latency"]
        cells = []
        for key, _ in stages:
            for window in ("5m", "60m"):
                value = (lat.get(window) or {}).get(key) or {"count": 0}
                cells.append(f"{_pcts(value)} ({value['count']})")
        rows.append([domain, *cells])
    return lines + table(rows)


def dispatchers_section(snap: dict) -> list[str]:
    lines = ["", "dispatchers"]
    if snap["dispatchers"] is None:  # a section PostgreSQL did not answer in time (named under alarms)
        lines.append("  unreadable")
    elif not snap["dispatchers"]:
        lines.append("  none running")
    for p in snap["dispatchers"] or ():
        stale = "  STALE" if p["stale"] else ""
        lines.append(f"  {p['name']}  up {fmt(p['uptime'])}  seen {fmt(p['last_seen_age'])} ago{stale}")
        for loop in p["loops"]:
            flag = "  STALE" if loop["stale"] else ""
            lines.append(f"    {loop['loop']:<24} tick {fmt(loop['last_tick_age'])} ago  errors {loop['errors']}{flag}")
    return lines


def render(snap: dict) -> str:
    lines = [
        f"database clock {snap['generated_at']}  NOTIFY queue usage {queue_usage(snap['notification_queue_usage'])}",
        "",
    ]
    rows = [["domain", *ACTIVE_STATUSES, "pend/due/dead", "oldest env", "oldest cand", "rate 1h"]]
    for domain, d in snap["domains"].items():
        env, rate = d["envelopes"], d["recovery"]["effective_rate"]
        rows.append(
            [
                domain if d.get("registered", True) else f"{domain} (unregistered)",
                *(known(d["backlog"][s]) for s in ACTIVE_STATUSES),
                f"{known(env['pending'])}/{known(env['due'])}/{known(env['dead'])}",
                fmt(env["oldest_pending_age"]),
                fmt(d["oldest_candidate_age"]),
                "-" if rate is None else f"{rate * 100:.0f}%",
            ]
        )
    t = snap["totals"]
    env = t["envelopes"]
    rows.append(
        [
            "TOTAL",
            *(known(t["backlog"][s]) for s in ACTIVE_STATUSES),
            f"{known(env['pending'])}/{known(env['due'])}/{known(env['dead'])}",
            fmt(t["oldest_pending_age"]),
            "",
            "",
        ]
    )
    lines += table(rows)
    lines += latency_section(snap)
    lines += ["", "last recovery rounds"]
    for domain, d in snap["domains"].items():
        for r in d["recovery"]["rounds"]:
            lines.append(
                f"  {domain:<13} {fmt(r['age'])} ago  scanned {r['scanned']}  effective {r['effective']}  "
                f"has_more {'yes' if r['has_more'] else 'no'}" + (f"  error {r['error']}" if r["error"] else "")
            )
    lines += rq_side(snap)
    lines += dispatchers_section(snap)
    return "\n".join(lines)


class Command(BaseCommand):
    help = "Print the dispatch dashboard's numbers: backlog, ages, recovery rounds, latency percentiles, dispatchers."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="machine-readable output (the same numbers)")

    def handle(self, *args, **options):
        import dispatch_app.rq.state.health as health

        snap = board.build()  # the dashboard's data: stats plus the RQ side, failures, pauses, alarms
        for d in snap["domains"].values():
            d.pop("chart", None)
        snap["workers"] = health.snapshot()
        if options["json"]:
            self.stdout.write(json.dumps(snap, indent=2, sort_keys=True))
        else:
            # Before rendering: a value's newline must not start a line of its own either.
            snap = escaped(snap)
            self.stdout.write(render(snap))
            self.stdout.write("\n".join(["", *health.render(snap["workers"])]))
