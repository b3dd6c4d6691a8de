"""The demo's per-stage latency table: per attempt, from timeline.stages (the one definition of stage times)."""

from __future__ import annotations

import dispatch_app.timeline.stage_sql as stage_sql

# The table's row names: the stage and the two instants it spans.
ROW_NAMES = {
    "backoff": "backoff (created→due)",
    "outbox": "outbox (due→dispatched)",
    "rq": "RQ (dispatched→started)",
    "worker": "worker (started→finished)",
}

StageLatency = stage_sql.StageSummary


def stage_latencies(min_job_id: int = 0, max_job_id: int | None = None) -> list[StageLatency]:
    """Percentiles per stage over every attempt of the jobs min_job_id <= id <= max_job_id (completed stages)."""
    return stage_sql.summary(min_job_id, max_job_id)


def format_table(rows: list[StageLatency]) -> str:
    def ms(value):
        return "-" if value is None else f"{value:,.1f}"

    width = max(len(name) for name in ROW_NAMES.values())
    lines = [f"{'stage':<{width}}  {'attempts':>8} {'p50 ms':>10} {'p95 ms':>10} {'p99 ms':>10} {'max ms':>10}"]
    for row in rows:
        lines.append(
            f"{ROW_NAMES.get(row.stage, row.stage):<{width}}  {row.count:>8} {ms(row.p50_ms):>10} "
            f"{ms(row.p95_ms):>10} {ms(row.p99_ms):>10} {ms(row.max_ms):>10}"
        )
    return "\n".join(lines)
