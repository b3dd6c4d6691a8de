"""The SQL of the envelope triggers that wake the dispatchers (NOTIFY on commit), kept apart from models.py.

PostgreSQL delivers a notification only when its transaction commits, so a dispatcher is never woken for work
it cannot see yet. The triggers are installed by ``store.triggers.install`` (no django-pgtrigger ignore check).
"""

from __future__ import annotations

from dispatch_app.config.settings import ANNOUNCE_PREFIX, NOTIFY_CHANNEL
from dispatch_app.config.tuning import ANNOUNCE_MAX_ROWS

# Conditional NOTIFY (issue 10): a notifying commit takes PostgreSQL's cluster-wide
# notify lock and loses group commit, so a writer announces work only while some
# dispatcher is idle and armed (dispatch_app.dispatch.arming, which also explains
# the hand-over that makes skipping it safe). The check is a plain read: writers
# never contend on it. A writer in REPEATABLE READ/SERIALIZABLE may read an arm
# state older than its own xid, which the arming fence cannot see: it always notifies.
ANNOUNCE_IF_NEEDED = (
    "IF current_setting('transaction_isolation') <> 'read committed' OR EXISTS ("
    "SELECT 1 FROM dispatch_app_notifyarm WHERE armed_until > statement_timestamp()) THEN "
)
# A small insert (a submit, a worker's retry) announces its envelopes themselves, as
# "+" and a JSON list of [envelope id, job id, attempt, domain, queue]: an idle
# dispatcher sends them to RQ at once and claims them after (dispatch.announced),
# so the claim's round trip is off the job's path. Only envelopes claimable now and
# of a domain not paused; the rest (delayed, paused, a big insert) are announced by
# domain as before: "worth a scan" (a small insert: up to tuning.ANNOUNCE_MAX_ROWS rows). Either way the
# table stays the record. An envelope its writer sends itself (store.writer_lease: leased at insert) wakes no
# one: the dispatcher claims it only if the writer's grace runs out, and its fallback tick finds it then.
NOTIFY_INSERTED = (
    ANNOUNCE_IF_NEEDED + f"PERFORM pg_notify('{NOTIFY_CHANNEL}', x.payload) FROM ("
    " WITH pending AS (SELECT id, job_id, attempt, domain, queue,"
    f"  (SELECT count(*) FROM new_rows) <= {ANNOUNCE_MAX_ROWS} AND available_at <= clock_timestamp()"
    "  AND domain NOT IN (SELECT domain FROM dispatch_app_domainpause) AS listed"
    "  FROM new_rows WHERE status = 'pending' AND lease_token IS NULL)"
    f" SELECT '{ANNOUNCE_PREFIX}' || json_agg(json_build_array(id, job_id, attempt, domain, queue) ORDER BY id)"
    " AS payload"
    " FROM pending WHERE listed HAVING count(*) > 0"
    " UNION ALL SELECT DISTINCT domain FROM pending WHERE NOT listed"
    ") x; END IF; RETURN NULL;"
)
# Work that became claimable now without an INSERT: re-armed to pending (admin,
# recovery), a lease given back (shutdown), made due now (admin), or a failed
# send with no backoff. A claim (leased) or a backoff into the future stays
# silent: nothing is claimable yet, and the fallback tick covers backoffs.
# A row trigger whose WHEN PostgreSQL checks itself: the UPDATEs of every job (the
# claim, the mark) call no function and build no transition table. A give-back of
# many rows notifies once per domain: PostgreSQL delivers one of identical
# notifications made in one transaction.
REARMED_WHEN = (
    "NEW.status = 'pending' AND NEW.lease_token IS NULL"
    " AND (OLD.status <> 'pending' OR OLD.lease_token IS NOT NULL OR NEW.available_at < OLD.available_at)"
)
NOTIFY_REARMED = (
    ANNOUNCE_IF_NEEDED + f"IF NEW.available_at <= clock_timestamp() THEN "
    f"PERFORM pg_notify('{NOTIFY_CHANNEL}', NEW.domain); END IF; END IF; RETURN NULL;"
)
