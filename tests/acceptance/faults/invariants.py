"""The SQL invariants every fault scenario ends with.

1. None lost: the jobs the scenario submitted are all there.
2. Every job is terminal, or in flight: an active job's current attempt has a
   live envelope (pending or dispatched, never dead) — something will move it.
3. One envelope per attempt, no gaps: attempts 1..N each have exactly one.
4. Executions counted exactly (the ledger of the domain's work, written by the
   worker processes): at most one execution per (job, attempt); every
   succeeded job's final attempt ran exactly once; an attempt that never
   started never ran.
5. A finished job's timestamps (database clock) are in order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

TERMINAL = ("succeeded", "failed", "outcome_unknown", "cancelled")
ACTIVE = ("submitted", "queued", "running")


@dataclass
class Report:
    jobs: int
    by_status: dict[str, int]
    executions: int
    duplicate_executions: int
    lost: int
    problems: list[str] = field(default_factory=list)

    def figures(self) -> dict:
        return {
            "jobs": self.jobs,
            "by_status": self.by_status,
            "executions": self.executions,
            "duplicate_executions": self.duplicate_executions,
            "jobs_lost": self.lost,
        }


def _rows(conn, query: str, params=()) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall()


def check(
    conn,
    ledger: Counter,
    *,
    expected_jobs: int,
    expect_status: dict[str, int] | str | None = "succeeded",
) -> Report:
    """Check the invariants on ``conn`` (psycopg or Django connection); raise AssertionError listing problems.

    ``expect_status``: "succeeded" (every job), a {status: count} map, or None (any terminal/in-flight mix).
    """
    problems: list[str] = []
    jobs = _rows(conn, "SELECT id, status, attempt FROM dispatch_app_job ORDER BY id")
    by_status = dict(Counter(status for _id, status, _attempt in jobs))

    # 1. none lost
    lost = max(0, expected_jobs - len(jobs))
    if len(jobs) != expected_jobs:
        problems.append(f"expected {expected_jobs} jobs, found {len(jobs)}")

    # 2. terminal or in flight
    stranded = _rows(
        conn,
        """
        SELECT j.id, j.status, j.attempt, e.status
        FROM dispatch_app_job j
        LEFT JOIN dispatch_app_dispatchenvelope e ON e.job_id = j.id AND e.attempt = j.attempt
        WHERE j.status IN ('submitted', 'queued', 'running')
          AND (e.id IS NULL OR e.status = 'dead')
        """,
    )
    if stranded:
        problems.append(f"{len(stranded)} active jobs with no live envelope (stranded), e.g. {stranded[:5]}")
        lost += len(stranded)

    # 3. one envelope per attempt, no gaps
    gaps = _rows(
        conn,
        """
        SELECT j.id, j.attempt, count(e.id), count(DISTINCT e.attempt), max(e.attempt)
        FROM dispatch_app_job j LEFT JOIN dispatch_app_dispatchenvelope e ON e.job_id = j.id
        GROUP BY j.id, j.attempt
        HAVING count(e.id) <> j.attempt OR count(DISTINCT e.attempt) <> j.attempt OR max(e.attempt) <> j.attempt
        """,
    )
    if gaps:
        problems.append(f"{len(gaps)} jobs whose envelopes are not exactly one per attempt, e.g. {gaps[:5]}")

    # 4. executions
    duplicates = {key: n for key, n in ledger.items() if n > 1}
    if duplicates:
        problems.append(f"{len(duplicates)} attempts executed more than once, e.g. {list(duplicates.items())[:5]}")
    job_ids = {job_id for job_id, _s, _a in jobs}
    strangers = [key for key in ledger if key[0] not in job_ids]
    if strangers:
        problems.append(f"executions of unknown jobs: {strangers[:5]}")
    for job_id, status, attempt in jobs:
        ran = ledger.get((job_id, attempt), 0)
        if status == "succeeded" and ran != 1:
            problems.append(f"job {job_id} succeeded but attempt {attempt} executed {ran} times")
        elif status in ("submitted", "queued") and ran:
            problems.append(f"job {job_id} is {status} but attempt {attempt} already executed {ran} times")
        if len(problems) > 30:
            break

    # 5. timestamps in order (database clock)
    disorder = _rows(
        conn,
        """
        SELECT id FROM dispatch_app_job
        WHERE status = 'succeeded' AND NOT (
            dispatched_at IS NOT NULL AND started_at IS NOT NULL AND finished_at IS NOT NULL
            AND submitted_at <= dispatched_at AND dispatched_at <= started_at AND started_at <= finished_at)
        LIMIT 5
        """,
    )
    if disorder:
        problems.append(f"succeeded jobs with missing or disordered timestamps, e.g. {disorder}")

    if expect_status == "succeeded":
        expect_status = {"succeeded": expected_jobs}
    if expect_status is not None and by_status != {k: v for k, v in expect_status.items() if v}:
        problems.append(f"statuses {by_status}, expected {expect_status}")

    report = Report(
        jobs=len(jobs),
        by_status=by_status,
        executions=sum(ledger.values()),
        duplicate_executions=sum(n - 1 for n in ledger.values() if n > 1),
        lost=lost,
        problems=problems,
    )
    assert not problems, "invariants violated:\n  " + "\n  ".join(problems)
    return report


def check_stack(stack, *, expected_jobs: int, expect_status="succeeded") -> Report:
    with stack.connect() as conn:
        return check(conn, stack.ledger(), expected_jobs=expected_jobs, expect_status=expect_status)
