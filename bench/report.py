"""The results: a table on stdout, JSON (one record per scenario + variant), PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

# Headline metrics per scenario, in table order (others stay in the JSON).
HEADLINES: dict[str, list[str]] = {
    "idle-latency": ["db_p50_ms", "db_p95_ms", "db_p99_ms", "client_p50_ms", "client_p99_ms", "db_p50_x_notify"],
    "isolation": ["db_p50_ms", "db_p99_ms", "client_p99_ms", "db_max_ms", "p99_x_unloaded"],
    "drain": ["envelopes", "drain_s", "rate_per_s", "extra_wait_s", "predicted_extra_wait_s"],
    "locked-head": ["later_rows_s", "head_rows_s", "hold_s", "later_x_skip_locked"],
    "recovery-storm": [
        "start_p50_ms",
        "start_p99_ms",
        "p50_x_none",
        "p99_x_none",
        "recovered_started_per_min",
        "redispatched_per_min_per_domain",
        "recovered_share_pct",
    ],
    "recovery-dispatcher": [
        "db_p50_ms",
        "db_p99_ms",
        "p99_x_off",
        "recovered",
        "effective_pct",
        "lock_wait_s",
        "connect_s",
    ],
    "send-admission": ["largest_batch", "peak_threads", "peak_rss_mb", "peak_vms_mb", "seconds"],
    "index": ["envelopes_per_s", "claim_p50_ms", "claim_p99_ms", "plan_ms", "index_mb", "x_partial"],
    "submit-cost": ["cpu_ms_per_submit", "cpu_x_plain", "wall_ms_per_submit"],
    "write-concurrency": [
        "submits_per_s",
        "submits_x_disabled",
        "submit_p50_ms",
        "submit_p99_ms",
        "missed_wakeups",
        "db_p50_ms",
        "db_p99_ms",
        "db_p99_x_today",
    ],
    "peers": [
        "w1_e2e_per_process_per_s",
        "w2_e2e_per_process_per_s",
        "w1_e2e_x_procrastinate",
        "w1_start_p50_ms_at200",
        "w1_start_p99_ms_at200",
        "w1_start_p50_x_procrastinate_at200",
        "w1_start_p99_x_procrastinate_at200",
    ],
    "worker-ceiling": [
        "rate_per_s",
        "x_rq_simpleworker",
        "x_procrastinate",
        "cpu_worker_ms_per_job",
        "cpu_total_ms_per_job",
        "redis_cmds_per_job",
    ],
    "pipeline-cpu": [
        "cpu_total_ms_per_job",
        "cpu_producer_ms_per_job",
        "cpu_dispatcher_ms_per_job",
        "cpu_worker_ms_per_job",
        "cpu_postgres_ms_per_job",
        "cpu_redis_ms_per_job",
        "cpu_x_procrastinate",
        "cpu_x_two_inserts",
    ],
}


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return str(value)


def _width(key: str) -> int:
    return max(12, len(key) + 2)


def table(records: list[dict]) -> str:
    lines = []
    current = None
    for rec in records:
        if rec["scenario"] != current:
            current = rec["scenario"]
            keys = HEADLINES.get(current, [])
            lines.append("")
            lines.append(f"== {current} ==")
            lines.append("  " + f"{'variant':<28}" + "".join(f"{k:>{_width(k)}}" for k in keys))
        keys = HEADLINES.get(current, [])
        if rec.get("error") and not rec["metrics"]:
            lines.append(f"  {rec['variant']:<28}  ERROR: {rec['error']}")
            continue
        lines.append(
            "  " + f"{rec['variant']:<28}" + "".join(f"{fmt(rec['metrics'].get(k)):>{_width(k)}}" for k in keys)
        )
        if rec.get("error"):
            lines.append(f"  {'':<28}  (a run failed: {rec['error']})")
    return "\n".join(lines).lstrip("\n")


def markdown_table(records: list[dict], scenario: str) -> str:
    keys = HEADLINES.get(scenario, [])
    rows = [r for r in records if r["scenario"] == scenario]
    out = ["| variant | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for rec in rows:
        if rec.get("error") and not rec["metrics"]:
            out.append(f"| {rec['variant']} | error: {rec['error']} |")
            continue
        out.append(f"| {rec['variant']} | " + " | ".join(fmt(rec["metrics"].get(k)) for k in keys) + " |")
    return "\n".join(out)


def peers_detail(records: list[dict]) -> str:
    """peers, one row per variant and worker-process count: e2e per process, commit -> start at each rate."""
    rows = [r for r in records if r["scenario"] == "peers" and r["metrics"]]
    keys = sorted({k for r in rows for k in r["metrics"]})
    counts = sorted({int(k[1 : k.index("_")]) for k in keys if k.startswith("w") and "_" in k})
    rates = sorted({int(k.rsplit("_at", 1)[1]) for k in keys if "_ms_at" in k})
    head = ["variant", "W", "e2e jobs/s per process", "x procrastinate"]
    for r in rates:
        head += [f"p50 @{r}/s ms", "x", f"p99 @{r}/s ms", "x"]
    out = ["| " + " | ".join(head) + " |", "|---|---:|" + "---:|" * (len(head) - 2)]
    for rec in rows:
        m = rec["metrics"]
        for w in counts:
            cells = [
                rec["variant"],
                str(w),
                fmt(m.get(f"w{w}_e2e_per_process_per_s")),
                fmt(m.get(f"w{w}_e2e_x_procrastinate")),
            ]
            for r in rates:
                for p in ("p50", "p99"):
                    cells += [
                        fmt(m.get(f"w{w}_start_{p}_ms_at{r}")),
                        fmt(m.get(f"w{w}_start_{p}_x_procrastinate_at{r}")),
                    ]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


PG_WORK = (
    ("commits", "pg_commits_per_job"),
    ("writing transactions", "pg_writing_xacts_per_job"),
    ("rows inserted", "pg_rows_inserted_per_job"),
    ("rows updated", "pg_rows_updated_per_job"),
    ("of which HOT", "pg_rows_hot_updated_per_job"),
    ("rows deleted", "pg_rows_deleted_per_job"),
    ("index entries (at most)", "pg_index_entries_max_per_job"),
    ("trigger function calls", "pg_trigger_calls_per_job"),
    ("trigger functions' own time (ms)", "pg_trigger_ms_per_job"),
    ("WAL bytes", "pg_wal_bytes_per_job"),
    ("statements (pg_stat_statements)", "pg_statements_per_job"),
    ("statements' planning + execution (ms)", "pg_statement_ms_per_job"),
)


def pg_work_detail(records: list[dict]) -> str:
    """pipeline-cpu: PostgreSQL's work per job (bench.pg_work), one column per pipeline, then per table."""
    rows = [r for r in records if r["scenario"] == "pipeline-cpu" and "pg_commits_per_job" in r["metrics"]]
    if not rows:
        return ""
    out = ["| per job | " + " | ".join(r["variant"] for r in rows) + " |", "|---|" + "---:|" * len(rows)]
    for label, key in PG_WORK:
        out.append(f"| {label} | " + " | ".join(fmt(r["metrics"].get(key)) for r in rows) + " |")
    for rec in rows:
        tables = rec["metrics"].get("pg_tables") or {}
        functions = rec["metrics"].get("pg_functions") or {}
        out += ["", f"{rec['variant']}, per table (ins / upd / HOT / del / index entries at most per job):", ""]
        for name, t in sorted(tables.items()):
            out.append(
                f"- {name}: {t['inserted']:.2f} / {t['updated']:.2f} / {t['hot_updated']:.2f} / "
                f"{t['deleted']:.2f} / {t['index_entries_max']:.2f}"
            )
        if functions:
            out.append("- trigger functions: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(functions.items())))
        for st in rec["metrics"].get("pg_statements") or ():
            query = st["query"].replace("|", "\\|")
            out.append(f"- {st['calls']:.2f} calls, {st['ms']:.3f} ms per job: `{query}`")
    return "\n".join(out)


def write_markdown(records: list[dict], out: Path, header: dict) -> Path:
    """results.md: every scenario's headline table, for docs/benchmarks.md."""
    machine = header.get("machine", {})
    lines = [
        f"Run: {machine.get('cores')} cores, load average before {machine.get('load_average')}, "
        f"after {header.get('load_after')}; repeat {header.get('repeat')}, medians shown; "
        f"{header.get('total_seconds')} s in total. {header.get('where', {}).get('database')}, "
        f"Redis {header.get('where', {}).get('redis')}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in header.get("versions", {}).items()),
    ]
    for scenario in dict.fromkeys(r["scenario"] for r in records):
        lines += ["", f"### {scenario}", "", markdown_table(records, scenario)]
        if scenario == "peers":
            lines += ["", peers_detail(records)]
        if scenario == "pipeline-cpu" and pg_work_detail(records):
            lines += ["", pg_work_detail(records)]
    path = out / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_json(records: list[dict], out: Path, header: dict) -> Path:
    path = out / "results.json"
    payload = [dict(header, **rec) for rec in records]
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def plots(records: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    by_scenario: dict[str, list[dict]] = {}
    for rec in records:
        by_scenario.setdefault(rec["scenario"], []).append(rec)

    def save(fig, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    for scenario in ("idle-latency", "isolation", "recovery-dispatcher", "recovery-storm", "peers"):
        recs = [r for r in by_scenario.get(scenario, []) if r["series"].get("db_cdf")]
        if not recs:
            continue
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for rec in recs:
            xs, ys = zip(*rec["series"]["db_cdf"], strict=True)
            ax.plot([max(x, 0.01) for x in xs], ys, label=rec["variant"])
        ax.set_xscale("log")
        ax.set_xlabel(
            "commit -> job start, ms (1 worker process, 200 jobs/s; log scale)"
            if scenario == "peers"
            else "commit -> the new job's first line, ms (log scale)"
            if scenario == "recovery-storm"
            else "commit -> in RQ, ms (dispatched_at - submitted_at, DB clock; log scale)"
        )
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"{scenario}: latency CDF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, f"{scenario}-latency-cdf.png")

    drain = [r for r in by_scenario.get("drain", []) if r["series"].get("progress")]
    if drain:
        fig, (big, small) = plt.subplots(1, 2, figsize=(12, 4.5))
        for rec in drain:
            ax = small if rec["variant"].startswith(("tick", "continue-small")) else big
            xs, ys = zip(*rec["series"]["progress"], strict=True)
            ax.plot(xs, ys, label=rec["variant"], drawstyle="steps-post")
        big.set_title("drain progress: the big backlog")
        small.set_title("K batches: one per 1 s tick vs continue-on-full")
        for ax in (big, small):
            ax.set_xlabel("seconds since go (DB clock)")
            ax.set_ylabel("envelopes dispatched")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        save(fig, "drain-progress.png")

    storm = [r for r in by_scenario.get("recovery-dispatcher", []) if r["series"].get("oldest_age")]
    if storm:
        fig, axes = plt.subplots(1, len(storm), figsize=(5 * len(storm), 4), squeeze=False, sharey=True)
        for ax, rec in zip(axes[0], storm, strict=True):
            for domain, points in sorted(rec["series"]["oldest_age"].items()):
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, [y / 60 for y in ys], label=domain)
            ax.ticklabel_format(axis="y", useOffset=False)
            ax.set_title(f"oldest candidate age, recovery {rec['variant']}")
            ax.set_xlabel("seconds")
            ax.set_ylabel("minutes")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        save(fig, "recovery-dispatcher-candidate-age.png")

    admission = [r for r in by_scenario.get("send-admission", []) if r["series"].get("by_batch")]
    if admission:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for rec in admission:
            points = rec["series"]["by_batch"]
            xs = [p["batch"] for p in points]
            a1.plot(xs, [p["peak_threads"] for p in points], marker="o", label=rec["variant"])
            a2.plot(xs, [p["peak_rss_mb"] for p in points], marker="o", label=rec["variant"])
        for ax, label in ((a1, "peak threads"), (a2, "peak RSS growth, MB")):
            ax.set_xlabel("chunks in the batch")
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        save(fig, "send-admission.png")
    return written
