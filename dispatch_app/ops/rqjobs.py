"""The RQ side of a page of jobs (the job list's "RQ side" column and a job's timeline), batched per server.

A queued job: its place in its queue and how many live workers serve that queue.
A running job: the worker running it and whether it lives, and since when it
does not (``rqside.read_workers``: death mark, hash gone, pid gone on this
host, or a PipelineWorker silent for ``SILENT_PERIODS`` heartbeats). A running
job whose RQ hash names no worker falls back on the worker its attempt's start
recorded. Redis trouble is returned in ``error``, never raised.
"""

from __future__ import annotations

from collections import defaultdict

import redis

from dispatch_app import redis_servers
from dispatch_app.domains import UnknownDomain, get_domain
from dispatch_app.models import JobAttempt
from dispatch_app.ops import rqside

LIVE = ("queued", "running")


def _queue(domain: str) -> str | None:
    try:
        return get_domain(domain).queue
    except UnknownDomain:
        return None


def states(jobs, statuses=LIVE) -> dict[int, rqside.JobRQState]:
    """{job id: JobRQState} of the current attempt of each job (model instances) in ``statuses``."""
    by_server: dict[str, list] = defaultdict(list)
    running = {job.pk for job in jobs if job.status == "running"}
    for job in jobs:
        if job.status in statuses and (queue := _queue(job.domain)):
            by_server[redis_servers.queue_url(queue)].append((job.pk, job.attempt, queue))
    out: dict[int, rqside.JobRQState] = {}
    for group in by_server.values():
        try:
            read = rqside.read_jobs(rqside.redis_conn(group[0][2]), group)
            out.update((job_id, state) for (job_id, _), state in read.items())
        except redis.RedisError as exc:
            error = f"{type(exc).__name__}: {exc}"
            for job_id, attempt, queue in group:
                out[job_id] = rqside.JobRQState(f"pf-{job_id}-{attempt}", queue, in_redis=False, error=error)
    _recorded_workers({pk: s for pk, s in out.items() if pk in running})
    return out


def _recorded_workers(candidates: dict[int, rqside.JobRQState]) -> None:
    """Running jobs whose RQ hash names no worker: the worker each attempt's start recorded (one query)."""
    missing = {pk: s for pk, s in candidates.items() if not s.worker and not s.error}
    if not missing:
        return
    attempts = {(pk, int(s.rq_id.rsplit("-", 1)[1])) for pk, s in missing.items()}
    rows = JobAttempt.objects.filter(job_id__in=list(missing)).exclude(worker="")
    for job_id, attempt, worker in rows.values_list("job_id", "attempt", "worker"):
        if (job_id, attempt) not in attempts:
            continue
        state = missing[job_id]
        state.worker = worker
        try:
            state.judge_worker(rqside.read_workers(rqside.redis_conn(state.queue), [worker])[worker])
        except redis.RedisError as exc:
            state.error = f"{type(exc).__name__}: {exc}"


def _since(state: rqside.JobRQState, fmt_instant) -> str:
    return fmt_instant(state.last_heartbeat) if state.last_heartbeat else "an unknown time"


def describe(status: str, state: rqside.JobRQState | None, *, fmt_instant) -> tuple[str, bool]:
    """(short text, alarming?) for the list column; ``fmt_instant`` formats an instant like the rest of the page."""
    if state is None:
        return "–", False
    if state.error:
        return f"Redis unreadable: {state.error}", True
    if state.taken_by and status != "running":
        if state.worker_alive:
            return f"taken by {state.worker} (not started yet)", False
        return f"taken by {state.worker}, not alive since {_since(state, fmt_instant)}", True
    if status == "running":
        if not state.worker:
            return "no worker recorded", True
        if state.worker_alive:
            return f"{state.worker}: alive", False
        return f"{state.worker}: not alive since {_since(state, fmt_instant)}", True
    if state.position:
        live = state.live_workers or 0
        workers = f"{live} live worker{'s' if live != 1 else ''}"
        lane = ""
        if state.behind_new is not None:
            # Its place in line across the lanes: how the RQ-stage list sorts (ops.queue_order).
            lane = (
                f" (recovery lane: taken after the {state.behind_new} new job(s) waiting: "
                f"#{state.behind_new + state.position} in line)"
            )
        return f"#{state.position} of {state.depth} in {state.queue}{lane}, {workers}", not live
    if state.in_redis:
        return f"RQ job {state.rq_status or '?'}", False
    return "not in Redis", True
