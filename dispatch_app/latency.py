"""Per-stage latencies of jobs, computed in SQL from the database timestamps."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

STAGES = (
    ("submitted→dispatched", "submitted_at", "dispatched_at"),
    ("dispatched→started", "dispatched_at", "started_at"),
    ("started→finished", "started_at", "finished_at"),
)


@dataclass(frozen=True)
class StageLatency:
    stage: str
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None


def stage_latencies(min_job_id: int = 0, max_job_id: int | None = None) -> list[StageLatency]:
    """Percentiles per stage for jobs with min_job_id <= id <= max_job_id (attempt 1 timings included)."""
    rows = []
    with connection.cursor() as cursor:
        for stage, start, end in STAGES:
            cursor.execute(
                f"""
                SELECT count(*),
                       percentile_cont(0.50) WITHIN GROUP (ORDER BY ms),
                       percentile_cont(0.95) WITHIN GROUP (ORDER BY ms),
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY ms),
                       max(ms)
                FROM (SELECT extract(epoch FROM ({end} - {start})) * 1000 AS ms
                      FROM dispatch_app_job
                      WHERE id >= %s AND (%s::bigint IS NULL OR id <= %s)
                        AND {start} IS NOT NULL AND {end} IS NOT NULL) t
                """,
                [min_job_id, max_job_id, max_job_id],
            )
            count, p50, p95, p99, worst = cursor.fetchone()
            rows.append(StageLatency(stage, count, *(None if v is None else float(v) for v in (p50, p95, p99, worst))))
    return rows


def format_table(rows: list[StageLatency]) -> str:
    def ms(value):
        return "-" if value is None else f"{value:,.1f}"

    lines = [f"{'stage':<22} {'jobs':>7} {'p50 ms':>10} {'p95 ms':>10} {'p99 ms':>10} {'max ms':>10}"]
    for row in rows:
        lines.append(
            f"{row.stage:<22} {row.count:>7} {ms(row.p50_ms):>10} {ms(row.p95_ms):>10} "
            f"{ms(row.p99_ms):>10} {ms(row.max_ms):>10}"
        )
    return "\n".join(lines)
