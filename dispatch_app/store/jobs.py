"""The job's creation with its first envelope (the outbox write), and the job's writes beside its status.

Its status moves are ``store.transitions``'s; what is here moves no status: the creation (``submitted``,
attempt 1), the vendor request id a worker records before a call, and ``updated_at`` moved by recovery to put a
job at the back of its discovery order.
"""

from __future__ import annotations

from functools import cache

from django.db.models import NOT_PROVIDED

from dispatch_app.models import Job
from dispatch_app.store.envelope_builder import fresh_columns, model_defaults
from dispatch_app.store.tables import ENVELOPE, JOB, PAUSE
from dispatch_app.store.writer_lease import WRITER_TOKEN


@cache
def create_statement() -> tuple[str, list, list[str]]:
    """(sql, default values, job fields returned): jobs and their first envelopes, one statement.

    Parameters, in order: domains, payloads (JSON text), queues, due datetimes, delays in seconds (the last two
    per job, either may be NULL), the trace context (JSON text or NULL), then the default values, then whether
    the writer sends the envelopes itself (``store.writer_lease``: only those due now, of a domain not paused).
    Built once from the models, so a field added later keeps its default. Each row: the job's id, the returned
    fields, its envelope's id and whether that envelope is the writer's to send.
    """
    job_columns, job_values = model_defaults(Job, {"domain", "payload", "trace_context"})
    env_columns, env_values = fresh_columns()
    returned = [f.attname for f in Job._meta.concrete_fields if f.db_default is not NOT_PROVIDED]
    returned_columns = [Job._meta.get_field(name).column for name in returned]

    def extra(columns):
        return "".join(f", {c}" for c in columns)

    def placeholders(columns):
        return "".join(", %s" for _ in columns)

    sql = f"""
WITH spec AS (
    SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::timestamptz[], %s::float8[])
        WITH ORDINALITY AS s(domain, payload, queue, at, delay, n)
), job AS (
    INSERT INTO {JOB} (domain, payload, trace_context{extra(job_columns)})
    SELECT domain, payload::jsonb, %s::jsonb{placeholders(job_columns)} FROM spec ORDER BY n
    RETURNING id{extra(returned_columns)}
), numbered AS (
    -- Ids are drawn in the order the rows are inserted (ORDER BY n).
    SELECT job.*, row_number() OVER (ORDER BY id) AS n FROM job
), envelope AS (
    INSERT INTO {ENVELOPE} (job_id, attempt, domain, queue, available_at{extra(env_columns)}, lease_token)
    SELECT numbered.id, 1, spec.domain, spec.queue,
           -- A delay is added to the database clock, never to the host's.
           COALESCE(spec.at, clock_timestamp() + make_interval(secs => spec.delay), clock_timestamp())
           {placeholders(env_columns)},
           CASE WHEN %s::boolean AND spec.at IS NULL AND spec.delay IS NULL
                     AND spec.domain NOT IN (SELECT domain FROM {PAUSE})
                THEN '{WRITER_TOKEN}'::uuid END
    FROM numbered JOIN spec USING (n) ORDER BY n
    RETURNING id, job_id, lease_token IS NOT NULL AS writer
)
SELECT numbered.id{"".join(f", numbered.{c}" for c in returned_columns)}, envelope.id, envelope.writer
FROM numbered JOIN envelope ON envelope.job_id = numbered.id ORDER BY n
"""
    return sql, [*job_values, *env_values], returned


# Committed before the vendor call, so recovery can ask the vendor what happened; only the running attempt's.
VENDOR_REQUEST_SQL = f"UPDATE {JOB} SET vendor_request_id = %s WHERE id = %s AND attempt = %s AND status = 'running'"

# To the back of recovery's discovery order (it reads updated_at): a job left alone, or one whose handling
# raised (``unfinished_only``: only while it is still unfinished).
TOUCH_SQL = f"UPDATE {JOB} SET updated_at = clock_timestamp() WHERE id = %s AND attempt = %s"
TOUCH_UNFINISHED_SQL = TOUCH_SQL + " AND status IN ('submitted', 'queued', 'running')"


def record_vendor_request(cursor, job_id: int, attempt: int, request_id: str) -> bool:
    """The running attempt's vendor request id; False when the attempt is no longer running."""
    cursor.execute(VENDOR_REQUEST_SQL, [request_id, job_id, attempt])
    return cursor.rowcount == 1


def touch(cursor, job_id: int, attempt: int, *, unfinished_only: bool = False) -> bool:
    """Move the attempt's ``updated_at`` to now; False when no such attempt (or, ``unfinished_only``, finished)."""
    cursor.execute(TOUCH_UNFINISHED_SQL if unfinished_only else TOUCH_SQL, [job_id, attempt])
    return cursor.rowcount == 1
