"""The SQL of the triggers that keep ``JobAttempt`` (per-attempt history), kept apart from models.py.

Every writer of a job or an envelope (dispatcher, worker, recovery, operator
actions, a psql session) is covered because the history is written by
PostgreSQL itself, never by application code. The hot paths stay cheap:

- submit: one statement-level trigger per INSERT statement; it writes a row only
  for envelopes created with a delay (scheduled submit, retry backoff), because
  only then is the due time worth remembering before the lease overwrites it.
- the dispatcher's mark: one statement-level trigger per UPDATE statement, sharing
  the transition tables the NOTIFY trigger already collects; it writes the
  attempt's dispatched_at. The job row trigger does not fire for submitted→queued.
- the worker's start and finish: one row trigger each (WHEN at trigger level, so
  updates that change neither status nor attempt never call it). No extra round
  trip: the worker may name itself with ``set_config('productflow.worker', name,
  true)`` inside its start statement (or once per session with ``false``); the
  start trigger copies it to the attempt.

An attempt's recorded facts are set once and never rewritten by a later
attempt: a new attempt only closes the old one (finished_at/outcome when not set
yet). The one exception is a re-armed dead envelope, which continues the same
attempt: its failed outcome is reopened (the events keep the story).
"""

from __future__ import annotations

ATTEMPT = "dispatch_app_jobattempt"
ERROR_MAX = 8000
WORKER_SETTING = "productflow.worker"
TERMINAL = "('succeeded', 'failed', 'outcome_unknown', 'cancelled')"

_COLUMNS = (
    "(job_id, attempt, domain, created_at, due_at, dispatched_at, started_at, worker, finished_at, outcome, error)"
)

# Fired AFTER UPDATE OF a job row, only when status or attempt changed (and not for the
# dispatcher's submitted→queued: the envelope trigger records the dispatch).
JOB_CONDITION = (
    "OLD.attempt IS DISTINCT FROM NEW.attempt OR (OLD.status IS DISTINCT FROM NEW.status "
    "AND NOT (OLD.status = 'submitted' AND NEW.status = 'queued'))"
)

JOB_DECLARE = [("at_", "timestamptz"), ("worker_", "text")]
JOB_FUNC = f"""
    at_ := clock_timestamp();
    worker_ := left(COALESCE(current_setting('{WORKER_SETTING}', true), ''), 200);
    IF NEW.attempt IS DISTINCT FROM OLD.attempt THEN
        -- The old attempt ends here, superseded; what it recorded itself stays.
        INSERT INTO {ATTEMPT} AS a {_COLUMNS}
        VALUES (OLD.id, OLD.attempt, OLD.domain, CASE WHEN OLD.attempt = 1 THEN OLD.submitted_at ELSE at_ END,
                NULL, NULL, OLD.started_at, '', at_, 'superseded', left(OLD.error, {ERROR_MAX}))
        ON CONFLICT (job_id, attempt) DO UPDATE SET
            started_at = COALESCE(a.started_at, EXCLUDED.started_at),
            finished_at = COALESCE(a.finished_at, EXCLUDED.finished_at),
            outcome = CASE WHEN a.outcome = '' THEN EXCLUDED.outcome ELSE a.outcome END,
            error = CASE WHEN a.error = '' THEN EXCLUDED.error ELSE a.error END;
        INSERT INTO {ATTEMPT} AS a {_COLUMNS}
        VALUES (NEW.id, NEW.attempt, NEW.domain, at_, NULL, NULL, NULL, '', NULL, '', '')
        ON CONFLICT (job_id, attempt) DO NOTHING;
    ELSIF NEW.status = 'running' THEN
        INSERT INTO {ATTEMPT} AS a {_COLUMNS}
        VALUES (NEW.id, NEW.attempt, NEW.domain, CASE WHEN NEW.attempt = 1 THEN NEW.submitted_at ELSE at_ END,
                NULL, NULL, COALESCE(NEW.started_at, at_), worker_, NULL, '', '')
        ON CONFLICT (job_id, attempt) DO UPDATE SET
            started_at = EXCLUDED.started_at,
            worker = CASE WHEN EXCLUDED.worker = '' THEN a.worker ELSE EXCLUDED.worker END;
    ELSIF NEW.status IN {TERMINAL} THEN
        INSERT INTO {ATTEMPT} AS a {_COLUMNS}
        VALUES (NEW.id, NEW.attempt, NEW.domain, CASE WHEN NEW.attempt = 1 THEN NEW.submitted_at ELSE at_ END,
                NULL, NULL, NEW.started_at, '', COALESCE(NEW.finished_at, at_), NEW.status,
                left(NEW.error, {ERROR_MAX}))
        ON CONFLICT (job_id, attempt) DO UPDATE SET
            started_at = COALESCE(a.started_at, EXCLUDED.started_at),
            finished_at = EXCLUDED.finished_at,
            outcome = EXCLUDED.outcome,
            error = EXCLUDED.error;
    ELSIF OLD.status IN {TERMINAL} THEN
        -- Re-opened for the same attempt (a re-armed dead envelope): the attempt goes on.
        UPDATE {ATTEMPT} SET finished_at = NULL, outcome = ''
        WHERE job_id = NEW.id AND attempt = NEW.attempt;
    END IF;
    RETURN NULL;
"""

# AFTER INSERT (statement) on envelopes: remember when a delayed envelope becomes due.
ENVELOPE_INSERT_FUNC = f"""
INSERT INTO {ATTEMPT} AS a {_COLUMNS}
SELECT n.job_id, n.attempt, n.domain, n.created_at, n.available_at, NULL, NULL, '', NULL, '', ''
FROM new_rows n WHERE n.available_at > n.created_at
ON CONFLICT (job_id, attempt) DO UPDATE SET due_at = EXCLUDED.due_at;
RETURN NULL;
"""

# AFTER UPDATE (statement) on envelopes: the attempt's dispatch, from the envelope that carried it.
ENVELOPE_UPDATE_FUNC = f"""
INSERT INTO {ATTEMPT} AS a {_COLUMNS}
SELECT n.job_id, n.attempt, n.domain, n.created_at, NULL, n.dispatched_at, NULL, '', NULL, '', ''
FROM new_rows n JOIN old_rows o ON o.id = n.id
WHERE n.status = 'dispatched' AND o.status <> 'dispatched' AND n.dispatched_at IS NOT NULL
ON CONFLICT (job_id, attempt) DO UPDATE SET dispatched_at = COALESCE(a.dispatched_at, EXCLUDED.dispatched_at);
RETURN NULL;
"""

# The migration's backfill: earlier attempts from their envelopes, the current attempt from the job row.
BACKFILL_SQL = f"""
INSERT INTO {ATTEMPT} {_COLUMNS}
SELECT e.job_id, e.attempt, e.domain, e.created_at, NULL, e.dispatched_at, NULL, '',
       (SELECT min(n.created_at) FROM dispatch_app_dispatchenvelope n
        WHERE n.job_id = e.job_id AND n.attempt > e.attempt), 'superseded', ''
FROM dispatch_app_dispatchenvelope e JOIN dispatch_app_job j ON j.id = e.job_id
WHERE e.attempt < j.attempt
ON CONFLICT (job_id, attempt) DO NOTHING;
INSERT INTO {ATTEMPT} {_COLUMNS}
SELECT j.id, j.attempt, j.domain, COALESCE(e.created_at, j.submitted_at), NULL,
       COALESCE(e.dispatched_at, CASE WHEN j.attempt = 1 THEN j.dispatched_at END), j.started_at, '',
       CASE WHEN j.status IN {TERMINAL} THEN COALESCE(j.finished_at, j.updated_at) END,
       CASE WHEN j.status IN {TERMINAL} THEN j.status ELSE '' END, left(j.error, {ERROR_MAX})
FROM dispatch_app_job j
LEFT JOIN dispatch_app_dispatchenvelope e ON e.job_id = j.id AND e.attempt = j.attempt
ON CONFLICT (job_id, attempt) DO NOTHING;
"""
