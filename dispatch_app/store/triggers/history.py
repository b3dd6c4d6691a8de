"""The SQL of the triggers that keep ``JobAttempt`` (per-attempt history), kept apart from models.py.

Every writer of a job or an envelope (dispatcher, worker, recovery, operator
actions, a psql session) is covered because the history is written by
PostgreSQL itself, never by application code. The hot paths stay cheap:

- submit: nothing, unless the envelope is created with a delay (scheduled submit,
  retry backoff): only then is the due time worth remembering before the lease
  overwrites it (a row trigger whose WHEN PostgreSQL checks without a call).
- the dispatcher's mark: nothing. The job row trigger does not fire for
  submitted→queued; the attempt's dispatch time is the envelope's dispatched_at,
  copied into the attempt when it starts or ends (one index probe there).
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

# Fired AFTER UPDATE OF a job row, only when status or attempt changed; not for the dispatcher's
# submitted→queued, so the mark pays nothing: the dispatch time stays on the envelope and is copied into
# the attempt when the attempt starts or ends (readers join the envelope until then).
JOB_CONDITION = (
    "OLD.attempt IS DISTINCT FROM NEW.attempt OR (OLD.status IS DISTINCT FROM NEW.status "
    "AND NOT (OLD.status = 'submitted' AND NEW.status = 'queued'))"
)

# The attempt's envelope (unique (job_id, attempt)): its creation and dispatch.
_ENVELOPE = (
    "SELECT e.created_at, e.dispatched_at INTO env_created_, env_dispatched_ "
    "FROM dispatch_app_dispatchenvelope e WHERE e.job_id = {job}.id AND e.attempt = {job}.attempt;"
)
# Attempt 1 was created by the submit (its envelope's creation, in the submit's transaction); a later
# attempt by the re-dispatch, recorded when the attempt number moved.
_CREATED = "COALESCE(env_created_, CASE WHEN {job}.attempt = 1 THEN {job}.submitted_at ELSE at_ END)"

JOB_DECLARE = [
    ("at_", "timestamptz"),
    ("worker_", "text"),
    ("env_created_", "timestamptz"),
    ("env_dispatched_", "timestamptz"),
]
JOB_FUNC = f"""
    at_ := clock_timestamp();
    IF NEW.attempt IS DISTINCT FROM OLD.attempt THEN
        -- The old attempt ends here, superseded; what it recorded itself stays.
        {_ENVELOPE.format(job="OLD")}
        INSERT INTO {ATTEMPT} AS a {_COLUMNS}
        VALUES (OLD.id, OLD.attempt, OLD.domain, {_CREATED.format(job="OLD")},
                NULL, env_dispatched_, OLD.started_at, '', at_, 'superseded', left(OLD.error, {ERROR_MAX}))
        ON CONFLICT (job_id, attempt) DO UPDATE SET
            dispatched_at = COALESCE(a.dispatched_at, EXCLUDED.dispatched_at),
            started_at = COALESCE(a.started_at, EXCLUDED.started_at),
            finished_at = COALESCE(a.finished_at, EXCLUDED.finished_at),
            outcome = CASE WHEN a.outcome = '' THEN EXCLUDED.outcome ELSE a.outcome END,
            error = CASE WHEN a.error = '' THEN EXCLUDED.error ELSE a.error END;
        INSERT INTO {ATTEMPT} AS a {_COLUMNS}
        VALUES (NEW.id, NEW.attempt, NEW.domain, at_, NULL, NULL, NULL, '', NULL, '', '')
        ON CONFLICT (job_id, attempt) DO NOTHING;
    ELSIF NEW.status = 'running' THEN
        worker_ := left(COALESCE(current_setting('{WORKER_SETTING}', true), ''), 200);
        {_ENVELOPE.format(job="NEW")}
        -- The dispatcher's mark may not have committed yet (the worker can be first): then the end fills it.
        INSERT INTO {ATTEMPT} AS a {_COLUMNS}
        VALUES (NEW.id, NEW.attempt, NEW.domain, {_CREATED.format(job="NEW")},
                NULL, env_dispatched_, COALESCE(NEW.started_at, at_), worker_, NULL, '', '')
        ON CONFLICT (job_id, attempt) DO UPDATE SET
            dispatched_at = COALESCE(a.dispatched_at, EXCLUDED.dispatched_at),
            started_at = EXCLUDED.started_at,
            worker = CASE WHEN EXCLUDED.worker = '' THEN a.worker ELSE EXCLUDED.worker END;
    ELSIF NEW.status IN {TERMINAL} THEN
        {_ENVELOPE.format(job="NEW")}
        INSERT INTO {ATTEMPT} AS a {_COLUMNS}
        VALUES (NEW.id, NEW.attempt, NEW.domain, {_CREATED.format(job="NEW")},
                NULL, env_dispatched_, NEW.started_at, '', COALESCE(NEW.finished_at, at_),
                NEW.status, left(NEW.error, {ERROR_MAX}))
        ON CONFLICT (job_id, attempt) DO UPDATE SET
            dispatched_at = COALESCE(a.dispatched_at, EXCLUDED.dispatched_at),
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

# AFTER INSERT of an envelope created with a delay: remember when it becomes due (the lease and backoffs
# overwrite available_at later). A row trigger whose WHEN PostgreSQL checks itself, so an envelope due at once
# (nearly every submit) calls nothing; as a statement trigger it ran a PL/pgSQL call and an INSERT ... SELECT
# over the statement's new rows on every submit to find none (docs/benchmarks.md, "A submit calls one trigger").
ENVELOPE_DUE_WHEN = "NEW.available_at > NEW.created_at"
ENVELOPE_DUE_FUNC = f"""
INSERT INTO {ATTEMPT} AS a {_COLUMNS}
VALUES (NEW.job_id, NEW.attempt, NEW.domain, NEW.created_at, NEW.available_at, NULL, NULL, '', NULL, '', '')
ON CONFLICT (job_id, attempt) DO UPDATE SET due_at = EXCLUDED.due_at;
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
