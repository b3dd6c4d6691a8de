"""What a waiting job waits for, in words: the same sentence on the dashboard, the job list and the timeline.

"waiting in: outbox" says where, not why. Per job (its current attempt's envelope, the domain's pause, the
dispatchers' liveness, the recovery policy) this names the blocker:

  paused       an operator paused the domain: by whom, since when, why
  backoff      the envelope is not due yet: a retry's backoff (attempt > 1), a send retry after failed sends,
               a recovery round's spread (its re-dispatches due one step after another), or a scheduled
               submit; due in N s
  lease        a dispatcher holds the envelope (claimed, being sent); the lease ends in N s
  dispatcher   due, and no live dispatcher to send it
  dead         the envelope is dead (sends gave up, or the domain is not registered): nothing sends it
  worker       a running job whose worker is dead: when recovery will act (RUNNING_STALE_SECONDS, its value)

The RQ side (queue position, live workers, a dead worker holding a job) is rqjobs' part; this module adds
recovery's timing to it. Every time is the database clock's (seconds computed in SQL).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from dispatch_app.recovery.event_kinds import COUNT_EVENTS
from dispatch_app.store.api import WRITER_TOKEN
from dispatch_app.store.tables import ENVELOPE, EVENT, JOB
from dispatch_app.views.timeline import format_duration

# The event a recovery re-dispatch writes on the attempt it moves on from.
RECOVERED = COUNT_EVENTS["redispatched"]


@dataclass(frozen=True)
class Blocker:
    kind: str  # paused | backoff | lease | writer | dispatcher | dead | worker | none
    text: str
    alarming: bool = False


def live_dispatcher(processes: list[dict]) -> bool:
    """Any dispatcher alive: an ``alive``/``dead`` flag when the heartbeat data carries one, else not stale."""
    for p in processes:
        if "alive" in p:
            if p["alive"]:
                return True
        elif "dead" in p:
            if not p["dead"]:
                return True
        elif not p.get("stale"):
            return True
    return False


def in_seconds(seconds) -> str:
    """A moment relative to now: "in 12.0 s" ahead, "12.0 s ago" behind."""
    if seconds is None:
        return "–"
    return f"in {format_duration(seconds)}" if seconds > 0 else f"{format_duration(-seconds)} ago"


def envelopes_of(cursor, job_ids) -> dict[int, dict]:
    """{job id: its current attempt's envelope} with the seconds until ``available_at`` (database clock)."""
    ids = list(job_ids)
    if not ids:
        return {}
    cursor.execute(
        f"""
        SELECT e.job_id, e.status, e.lease_token IS NOT NULL, extract(epoch FROM e.available_at - clock_timestamp()),
               e.send_attempts, e.last_error, e.attempt, e.lease_token IS NOT DISTINCT FROM %s::uuid,
               EXISTS (SELECT 1 FROM {EVENT} v WHERE v.job_id = e.job_id AND v.attempt = e.attempt - 1
                       AND v.kind = %s)
        FROM {ENVELOPE} e JOIN {JOB} j ON j.id = e.job_id AND j.attempt = e.attempt
        WHERE e.job_id = ANY(%s)
        """,
        [str(WRITER_TOKEN), RECOVERED, ids],
    )
    return {
        job_id: {
            "status": status,
            "leased": leased,
            "due_in": float(due_in),
            "send_attempts": sends,
            "last_error": error,
            "attempt": attempt,
            "recovered": recovered,
            "writer": writer,
        }
        for job_id, status, leased, due_in, sends, error, attempt, writer, recovered in cursor.fetchall()
    }


def paused_text(pause: dict) -> str:
    text = f"dispatch of its domain paused by {pause['paused_by'] or 'someone'} {format_duration(pause['age'])} ago"
    return text + (f": {pause['reason']}" if pause.get("reason") else "")


def outbox(status: str, attempt: int, envelope: dict | None, pause: dict | None, dispatcher_alive: bool) -> Blocker:
    """The blocker of a job that has not reached RQ yet (``submitted``)."""
    if status != "submitted":
        return Blocker("none", "")
    if envelope is None:
        return Blocker("dead", "no envelope for this attempt: nothing will send it", True)
    if envelope["status"] == "dead":
        error = f" ({envelope['last_error'][:120]})" if envelope["last_error"] else ""
        return Blocker("dead", f"envelope dead{error}: nothing sends it until it is re-armed", True)
    if envelope["status"] != "pending":
        return Blocker("none", "sent to RQ; the dispatcher's mark is on its way")
    due_in = envelope["due_in"]
    if envelope["leased"] and due_in > 0:
        return Blocker("lease", f"being sent by a dispatcher (its lease ends {in_seconds(due_in)})")
    if envelope.get("writer"):
        return Blocker(
            "writer",
            f"sent to RQ by its writer after the commit (SUBMIT_SENDS), submitted {in_seconds(due_in)}; a dispatcher "
            "sends it again if no worker started it within SUBMIT_SEND_GRACE",
        )
    if pause is not None:
        # Before the backoff: a paused domain's due envelopes wait for the resume, not for their time.
        return Blocker("paused", paused_text(pause), True)
    if due_in > 0:
        if envelope["send_attempts"]:
            error = f"; last error: {envelope['last_error'][:120]}" if envelope["last_error"] else ""
            text = f"send backoff after {envelope['send_attempts']} failed send(s): due {in_seconds(due_in)}{error}"
        elif attempt > 1 and envelope.get("recovered"):
            text = f"re-dispatched by recovery, spread over its round (attempt {attempt}): due {in_seconds(due_in)}"
        elif attempt > 1:
            text = f"backoff before retry {attempt - 1} (attempt {attempt}): due {in_seconds(due_in)}"
        else:
            text = f"scheduled: due {in_seconds(due_in)}"
        return Blocker("backoff", text)
    if not dispatcher_alive:
        return Blocker("dispatcher", "due, and no live dispatcher to send it", True)
    return Blocker("none", f"due {in_seconds(due_in)}, waiting for a dispatcher's claim")


def recovery_eta(updated_age: float | None, stale_seconds: float) -> str:
    """When recovery takes up a running job whose worker is gone: its candidate test is the job's last change
    older than RUNNING_STALE_SECONDS, at the domain's next round after that."""
    setting = f"RUNNING_STALE_SECONDS = {stale_seconds:g} s"
    if updated_age is None:
        return f"recovery takes it up once it is untouched for {setting}"
    left = stale_seconds - updated_age
    if left <= 0:
        return f"recovery takes it up at its next round (untouched for {format_duration(updated_age)} ≥ {setting})"
    return f"recovery takes it up {in_seconds(left)} (at its first round after {setting} untouched)"


def recovery_eta_for(domain: str, updated_age: float | None) -> str:
    """``recovery_eta`` with the domain's effective RUNNING_STALE_SECONDS (DISPATCH['RECOVERY'] overrides)."""
    from dispatch_app.config.settings import dispatch_settings
    from dispatch_app.domains import domain_keys
    from dispatch_app.domains.policy import resolve

    if domain not in domain_keys():
        return "no recovery: the domain is not registered"
    return recovery_eta(updated_age, resolve(domain, dispatch_settings().RECOVERY).running_stale_seconds)


def domain_waits(cursor) -> dict[str, dict]:
    """Per domain, envelopes not due yet (backoff, send retry, schedule), those leased, and the next due time."""
    cursor.execute(
        f"""
        SELECT domain,
               count(*) FILTER (WHERE lease_token IS NULL AND available_at > clock_timestamp()),
               count(*) FILTER (WHERE lease_token IS NOT NULL AND available_at > clock_timestamp()),
               extract(epoch FROM min(available_at) FILTER (WHERE lease_token IS NULL
                                                            AND available_at > clock_timestamp())
                                  - clock_timestamp())
        FROM {ENVELOPE} WHERE status = 'pending' GROUP BY domain
        """
    )
    return {
        domain: {"not_due": not_due, "leased": leased, "next_due_in": None if nxt is None else float(nxt)}
        for domain, not_due, leased, nxt in cursor.fetchall()
    }


def running_workers(cursor) -> list[tuple[str, str, int, float]]:
    """(domain, worker, running jobs, seconds since the oldest of them was last touched) of the running jobs'
    current attempts, by the worker their start recorded."""
    cursor.execute(
        f"""
        SELECT j.domain, a.worker, count(*), extract(epoch FROM clock_timestamp() - min(j.updated_at))
        FROM {JOB} j JOIN dispatch_app_jobattempt a ON a.job_id = j.id AND a.attempt = j.attempt
        WHERE j.status = 'running' AND a.worker <> ''
        GROUP BY j.domain, a.worker ORDER BY j.domain, a.worker
        """
    )
    return [(d, w, n, float(age)) for d, w, n, age in cursor.fetchall()]


def dead_worker_banners(running: list[tuple], rq: dict) -> list[dict]:
    """A red banner per domain and dead worker still holding running jobs, whether or not another worker of the
    queue lives (that one will not take them: they are not in the queue any more). Unknown for a domain whose
    Redis server was not read (no banner: the Redis banner says so)."""
    known = {w["name"]: w for w in rq.get("workers", [])}
    readable = set(rq.get("domains") or {})  # a domain whose Redis server was not read: its workers are unknown
    out = []
    for domain, worker, count, oldest_age in running:
        if domain not in readable:
            continue
        info = known.get(worker)
        if info is not None and info.get("alive"):
            continue
        why = "its hash is gone from Redis" if info is None else (info.get("dead_reason") or "not alive")
        out.append(
            {
                "level": "error",
                "key": "dead-worker-holds",
                "text": f"{domain}: {count} running job(s) held by dead worker {worker} ({why}); "
                + recovery_eta_for(domain, oldest_age)
                + ", or retry them now.",
                "link": f"worker={quote(worker)}&status__exact=running&domain__exact={domain}",
            }
        )
    return out


PREFETCH_SCAN = 500  # queued jobs read from Redis per domain when PostgreSQL counts more queued than RQ holds


def prefetched_by_dead(domains: dict, rq: dict) -> list[dict]:
    """Queued jobs a dead worker took off its queue (prefetched) and never started: the gap between "queued in
    PostgreSQL" and "waiting in Redis". Read only for a domain with such a gap (its oldest PREFETCH_SCAN queued
    jobs, one pipeline per server); a red banner per dead worker holding some."""
    import dispatch_app.rq.state.jobs as rqjobs
    from dispatch_app.models import Job

    out = []
    for domain, d in domains.items():
        queue = d.get("rq") or {}
        queued = (d.get("backlog") or {}).get("queued") or 0  # None: not read
        if not queue or queued <= (queue.get("depth") or 0):
            continue
        jobs = list(Job.objects.filter(domain=domain, status="queued").order_by("dispatched_at", "id")[:PREFETCH_SCAN])
        held: dict[str, int] = {}
        for state in rqjobs.states(jobs, statuses=("queued",)).values():
            if state.taken_by and state.worker_alive is False:
                held[state.taken_by] = held.get(state.taken_by, 0) + 1
        for worker, count in sorted(held.items()):
            out.append(
                {
                    "level": "error",
                    "key": "prefetched-by-dead",
                    "text": f"{domain}: {count} queued job(s) were taken off queue {queue.get('queue', domain)} by "
                    f"dead worker {worker} and never started (why PostgreSQL counts {queued} queued and Redis "
                    f"{queue.get('depth', 0)}); a live worker requeues them once the dead one's hash is gone, "
                    "or retry them now.",
                    "link": f"stage=rq&domain__exact={domain}",
                }
            )
    return out
