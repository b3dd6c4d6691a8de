"""Builders for the operations tests: rows with timestamps set in SQL relative to clock_timestamp()."""

from __future__ import annotations

from django.db import connection

from dispatch_app.models import DispatchEnvelope, Job
from tests.factories import PAYLOADS


def sql(statement: str, params=None):
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])
        return cursor.fetchall() if cursor.description else cursor.rowcount


def ago(seconds: float) -> str:
    """An SQL expression: the database clock minus ``seconds``."""
    return f"clock_timestamp() - make_interval(secs => {float(seconds)})"


def job(domain="delivery", status="submitted", *, attempt=1, updated_ago=None, **timestamps_ago) -> Job:
    """A job; submitted_ago=, dispatched_ago=, started_ago=, finished_ago= are seconds before now."""
    row = Job.objects.create(domain=domain, payload=dict(PAYLOADS.get(domain, {})), status=status, attempt=attempt)
    sets = [
        f"{name.removesuffix('_ago')}_at = {ago(value)}" for name, value in timestamps_ago.items() if value is not None
    ]
    if sets:
        sql(f"UPDATE dispatch_app_job SET {', '.join(sets)} WHERE id = %s", [row.pk])
    if updated_ago is not None:
        # The updated_at trigger stamps only an UPDATE that leaves the column as it was: this one keeps its value.
        sql(f"UPDATE dispatch_app_job SET updated_at = {ago(updated_ago)} WHERE id = %s", [row.pk])
    row.refresh_from_db()
    return row


def envelope(
    job_row: Job,
    status="pending",
    *,
    attempt=None,
    created_ago=0.0,
    available_ago=None,
    dispatched_ago=None,
    send_attempts=0,
    last_error="",
    queue=None,
) -> DispatchEnvelope:
    # Created pending, then moved to its status with its timestamps in one UPDATE, as the dispatcher's mark does.
    env = DispatchEnvelope.objects.create(
        job=job_row,
        attempt=attempt or job_row.attempt,
        domain=job_row.domain,
        queue=queue or job_row.domain,
        status="pending",
        send_attempts=send_attempts,
        last_error=last_error,
    )
    available = created_ago if available_ago is None else available_ago
    sets = ["status = %s", f"created_at = {ago(created_ago)}", f"available_at = {ago(available)}"]
    if dispatched_ago is not None:
        sets.append(f"dispatched_at = {ago(dispatched_ago)}")
    sql(f"UPDATE dispatch_app_dispatchenvelope SET {', '.join(sets)} WHERE id = %s", [status, env.pk])
    env.refresh_from_db()
    return env


def attempt_row(
    job_row: Job,
    attempt: int,
    *,
    outcome: str = "",
    error: str = "",
    worker: str = "",
    with_envelope=True,
    **instants_ago,
):
    """A JobAttempt row as the history triggers would have left it: created_ago=, due_ago=, dispatched_ago=,
    started_ago=, finished_ago= are seconds before now. With dispatched_ago, its dispatched envelope too (the
    dashboard's windows select attempts by their envelope's dispatch), unless with_envelope=False."""
    names = {k.removesuffix("_ago") + "_at": ago(v) for k, v in instants_ago.items() if v is not None}
    updates = ", ".join(f"{n} = EXCLUDED.{n}" for n in dict.fromkeys(("worker", "outcome", "error", "due_at", *names)))
    sql(
        f"INSERT INTO dispatch_app_jobattempt (job_id, attempt, domain, worker, outcome, error, {', '.join(names)}) "
        f"VALUES (%s, %s, %s, %s, %s, %s, {', '.join(names.values())}) "
        f"ON CONFLICT (job_id, attempt) DO UPDATE SET {updates}",
        [job_row.pk, attempt, job_row.domain, worker, outcome, error],
    )
    if with_envelope and instants_ago.get("dispatched_ago") is not None:
        env = envelope(job_row, "dispatched", attempt=attempt, dispatched_ago=instants_ago["dispatched_ago"])
        # The very same instants as the attempt row (each statement reads its own clock).
        sql(
            "UPDATE dispatch_app_dispatchenvelope e SET created_at = a.created_at, available_at = a.created_at, "
            "dispatched_at = a.dispatched_at FROM dispatch_app_jobattempt a "
            "WHERE e.id = %s AND a.job_id = e.job_id AND a.attempt = e.attempt",
            [env.pk],
        )


def percentile_cont(values, q: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
