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
from dataclasses import dataclass
from datetime import datetime

import redis

import dispatch_app.domains.lanes as lanes
import dispatch_app.rq.internals as rq_internals
import dispatch_app.rq.junk as junk
import dispatch_app.rq.servers as redis_servers
import dispatch_app.rq.state.queues as rqside
from dispatch_app.config.tuning import RQ_LIST_READ_MAX
from dispatch_app.domains import UnknownDomain, get_domain
from dispatch_app.models import JobAttempt
from dispatch_app.rq.fields import TAKEN_BY
from dispatch_app.rq.ids import rq_job_id

LIVE = ("queued", "running")


@dataclass
class JobRQState:
    """What Redis says about one attempt of a job."""

    rq_id: str
    queue: str
    in_redis: bool
    rq_status: str = ""
    position: int | None = None  # 1 = next to be taken
    depth: int | None = None
    live_workers: int | None = None  # live workers listening on its queue
    worker: str = ""
    worker_alive: bool | None = None
    worker_dead_reason: str = ""
    last_heartbeat: datetime | None = None  # the job's last heartbeat from its worker (worker host's clock)
    error: str = ""
    taken_by: str = ""  # a PipelineWorker took it off the queue and has not started it (rq.worker.fetch)
    # In a late lane (dispatch_app.domains.lanes): the new jobs waiting, which workers take before it.
    behind_new: int | None = None
    # Queued and not in the first ``looked_at`` ids of its lanes, which hold ``unread`` ids: further back (Redis
    # would run one unbounded scan per job of a page while every send and take waits), not looked for.
    unread: int | None = None
    looked_at: int = RQ_LIST_READ_MAX

    def judge_worker(self, info: rqside.WorkerInfo) -> None:
        """Take the running worker's verdict; a dead one's last heartbeat is the job's last sign of life."""
        self.worker_alive, self.worker_dead_reason = info.alive, info.dead_reason
        if (
            not info.alive
            and info.last_heartbeat
            and (self.last_heartbeat is None or info.last_heartbeat > self.last_heartbeat)
        ):
            self.last_heartbeat = info.last_heartbeat


def _places(ids: list, wanted: set[str]) -> dict[str, int]:
    """{id: index from the head} of the page's own ids only, an id listed twice at its first place (anyone may push
    any bytes to a queue); the other ids of a 5,000-id head are compared as Redis sent them, never decoded."""
    keys = wanted | {rq_id.encode() for rq_id in wanted}
    found: dict[str, int] = {}
    for n, raw in enumerate(ids):
        if raw in keys:
            found.setdefault(rqside.text(raw), n)
    return found


def read_jobs(conn: redis.Redis, attempts: list[tuple[int, int, str]]) -> dict[tuple[int, int], JobRQState]:
    """The RQ side of many (job id, attempt, domain queue) on one server: one pipeline for the jobs and their
    queues' lanes, one for the workers they name. Raises redis.RedisError.

    Places in line come from each lane's head, read once per lane (``RQ_LIST_READ_MAX`` ids), not from a search
    per job: Redis runs one command at a time, and a page's searches held every send and take behind them."""
    queues = sorted({lane for _, _, q in attempts for lane in lanes.queues(q)})
    with conn.pipeline(transaction=False) as pipe:
        for job_id, attempt, _ in attempts:
            pipe.hmget(
                rq_internals.job_key(rq_job_id(job_id, attempt)), "status", "worker_name", "last_heartbeat", TAKEN_BY
            )
        for queue in queues:
            pipe.llen(rqside.queue_key(queue))
            pipe.smembers(rq_internals.workers_of_queue_key(queue))
            pipe.lrange(rqside.queue_key(queue), 0, RQ_LIST_READ_MAX - 1)
        raw = junk.replies(pipe, "a job's RQ side")  # a key of another type (junk anyone may write) reads as empty
    per_queue = raw[len(attempts) :]
    depth = {q: int(per_queue[3 * i] or 0) for i, q in enumerate(queues)}
    members = {
        q: [rqside.text(m).removeprefix(rqside.WORKER_PREFIX) for m in per_queue[3 * i + 1] or ()]
        for i, q in enumerate(queues)
    }
    wanted = {rq_job_id(job_id, attempt) for job_id, attempt, _ in attempts}
    heads = {q: _places(per_queue[3 * i + 2] or (), wanted) for i, q in enumerate(queues)}
    out = {}
    for i, (job_id, attempt, queue) in enumerate(attempts):
        status, worker, heartbeat, taken_by = raw[i] or (None, None, None, None)
        positions = [heads[name].get(rq_job_id(job_id, attempt)) for name in lanes.queues(queue)]
        # The lane it waits in (the domain queue's own when it waits in none).
        lane, position = next(
            ((name, p) for name, p in zip(lanes.queues(queue), positions, strict=True) if p is not None), (queue, None)
        )
        # Taken off the queue by a worker that has not started it: that worker is the one to judge.
        unlisted = position is None and rqside.text(status) == "queued"
        taken_by = rqside.text(taken_by) if unlisted and not worker else ""
        lane_depths = [depth[name] for name in lanes.queues(queue)]
        unread = sum(lane_depths) if unlisted and not taken_by and max(lane_depths) > RQ_LIST_READ_MAX else None
        out[(job_id, attempt)] = JobRQState(
            rq_id=rq_job_id(job_id, attempt),
            queue=lane,
            in_redis=status is not None,
            rq_status=rqside.text(status),
            position=None if position is None else int(position) + 1,
            depth=depth[lane],
            worker=rqside.text(worker) or taken_by,
            last_heartbeat=rqside.parse_utc(rqside.text(heartbeat)),
            taken_by=taken_by,
            behind_new=depth[queue] if lane != queue else None,
            unread=unread,
        )
    workers = rqside.read_workers(
        conn, {n for ns in members.values() for n in ns} | {s.worker for s in out.values()} - {""}
    )
    for state in out.values():
        state.live_workers = sum(1 for n in members[state.queue] if workers[n].alive)
        if state.worker:
            state.judge_worker(workers[state.worker])
    return out


def job_state(job_id: int, attempt: int, queue: str, conn: redis.Redis | None = None) -> JobRQState:
    """The RQ side of one attempt: its place in the queue, or the worker running it and whether it lives."""
    try:
        return read_jobs(conn or rqside.redis_conn(queue), [(job_id, attempt, queue)])[(job_id, attempt)]
    except redis.RedisError as exc:
        return JobRQState(rq_job_id(job_id, attempt), queue, in_redis=False, error=f"{type(exc).__name__}: {exc}")


def _queue(domain: str) -> str | None:
    try:
        return get_domain(domain).queue
    except UnknownDomain:
        return None


def states(jobs, statuses=LIVE) -> dict[int, JobRQState]:
    """{job id: JobRQState} of the current attempt of each job (model instances) in ``statuses``."""
    by_server: dict[str, list] = defaultdict(list)
    running = {job.pk for job in jobs if job.status == "running"}
    for job in jobs:
        if job.status in statuses and (queue := _queue(job.domain)):
            by_server[redis_servers.queue_url(queue)].append((job.pk, job.attempt, queue))
    out: dict[int, JobRQState] = {}
    for group in by_server.values():
        try:
            read = read_jobs(rqside.redis_conn(group[0][2]), group)
            out.update((job_id, state) for (job_id, _), state in read.items())
        except redis.RedisError as exc:
            error = f"{type(exc).__name__}: {exc}"
            for job_id, attempt, queue in group:
                out[job_id] = JobRQState(rq_job_id(job_id, attempt), queue, in_redis=False, error=error)
    _recorded_workers({pk: s for pk, s in out.items() if pk in running})
    return out


def _recorded_workers(candidates: dict[int, JobRQState]) -> None:
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


def _since(state: JobRQState, fmt_instant) -> str:
    return fmt_instant(state.last_heartbeat) if state.last_heartbeat else "an unknown time"


def describe(status: str, state: JobRQState | None, *, fmt_instant) -> tuple[str, bool]:
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
            # Its place in line across the lanes: how the RQ-stage list sorts (rq.state.order).
            lane = (
                f" (recovery lane: taken after the {state.behind_new} new job(s) waiting: "
                f"#{state.behind_new + state.position} in line)"
            )
        return f"#{state.position} of {state.depth} in {state.queue}{lane}, {workers}", not live
    if state.unread is not None:
        live = state.live_workers or 0
        return (
            f"queued in {state.queue} past the first {state.looked_at:,} of {state.unread:,} (not looked for further), "
            f"{live} live worker{'s' if live != 1 else ''}"
        ), not live
    if state.in_redis:
        return f"RQ job {state.rq_status or '?'}", False
    return "not in Redis", True
