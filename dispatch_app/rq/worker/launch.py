"""How ``manage.py runworkers`` runs PipelineWorkers: one in this process, or N under RQ's WorkerPool.

RQ's WorkerPool forks and respawns the workers (a worker that exits after
``--max-jobs`` is replaced, in burst mode none is); its stock child entry point
passes neither ``max_jobs`` nor the worker's settings, so ``ProjectWorkerPool``
replaces only that entry point.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass

import redis
from django.conf import settings
from rq.serializers import JSONSerializer
from rq.worker_pool import WorkerPool

import dispatch_app.rq.servers as redis_servers
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.config.tuning import PROCESSES_PER_CORE
from dispatch_app.domains import lane_queue_names, queue_names
from dispatch_app.rq.worker.worker import PipelineWorker
from dispatch_app.runtime.gcfreeze import freeze_startup

log = logging.getLogger("dispatch_app.rqworker")


def default_processes() -> int:
    """``runworkers``'s (and the demo's) worker processes when none are given: two per core."""
    return PROCESSES_PER_CORE * (os.cpu_count() or 1)


class BadQueues(ValueError):
    pass


@dataclass(frozen=True)
class Plan:
    queues: tuple[str, ...]
    processes: int
    burst: bool = False
    max_jobs: int | None = None
    logging_level: str = "INFO"
    late_lanes: bool = True  # False: a domain queue brings its new lane alone (--new-lanes-only)
    nice: int = 0  # added to the worker processes' niceness before they start (--nice)


def parse_queues(text: str | None) -> tuple[str, ...]:
    """``a,b`` -> ("a", "b"); every name must be a domain queue (dispatch_app.domains.queue_names()) or one
    of their lanes (``delivery.recovery``). A domain queue brings its lanes (``lane_share.with_lanes``); a lane
    named alone is listened on alone, which is how recovered work gets workers of its own."""
    if text is None:
        return queue_names()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise BadQueues(f"--queues is empty; valid queues: {', '.join(queue_names())}")
    unknown = [n for n in names if n not in lane_queue_names()]
    if unknown:
        raise BadQueues(
            f"unknown queue(s) {', '.join(unknown)}; valid queues: {', '.join(queue_names())} "
            f"(or one of their lanes: {', '.join(lane_queue_names()[len(queue_names()) :])})"
        )
    return names


def one_server(queues: tuple[str, ...]) -> str:
    """The Redis URL all these queues live on; a worker listens on one server only, so mixing them is refused."""
    groups = redis_servers.by_server(queues)
    if len(groups) > 1:
        runs = "; ".join(f"--queues {','.join(names)} (on {redis_servers.label(url)})" for url, names in groups.items())
        raise BadQueues(
            f"queues {', '.join(queues)} live on {len(groups)} Redis servers (RQ_QUEUES) and one worker listens on "
            f"one server only: run one runworkers per server: {runs}"
        )
    return next(iter(groups), settings.REDIS_URL)


def worker_name() -> str:
    """Readable in rq info and the dashboard: host, pid, and a suffix unique across restarts."""
    return f"pf.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


def connect(queues=()) -> redis.Redis:
    """A new connection to the server the queues live on (their RQ_QUEUES entry; REDIS_URL without queues)."""
    return redis.Redis.from_url(one_server(tuple(queues)) if queues else settings.REDIS_URL)


def build_worker(
    queues, connection: redis.Redis | None = None, name: str | None = None, *, late_lanes: bool = True
) -> PipelineWorker:
    """A PipelineWorker with the project's settings; waits for Redis if it is down at start-up."""
    conf = dispatch_settings()
    delay = 0.5
    while True:
        try:
            return PipelineWorker(
                list(queues),
                name=name or worker_name(),
                connection=connection or connect(queues),
                serializer=JSONSerializer,
                late_lanes=late_lanes,
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.error(
                "Redis unavailable at worker start-up (%s); retrying in %.1fs",
                exc,
                delay,
                extra={"action": "worker_redis_unavailable", "domain": "worker"},
            )
            time.sleep(delay)  # nothing is running yet; SIGTERM's default action ends the process
            delay = min(delay * 2, conf.RECONNECT_BACKOFF_MAX)


def run_one(plan: Plan) -> bool:
    worker = build_worker(plan.queues, late_lanes=plan.late_lanes)
    freeze_startup("worker")
    return worker.work(burst=plan.burst, max_jobs=plan.max_jobs, logging_level=plan.logging_level)


def _pool_child(name, queue_names, burst=True, logging_level="INFO", max_jobs=None, late_lanes=True):
    # A forked child: Django is set up and the parent holds no database connection
    # (closed before the pool started), so this child opens its own.
    worker = build_worker(queue_names, late_lanes=late_lanes)
    freeze_startup("worker")
    worker.work(burst=burst, max_jobs=max_jobs, logging_level=logging_level)


class ProjectWorkerPool(WorkerPool):
    def __init__(self, plan: Plan):
        super().__init__(
            list(plan.queues),
            connection=connect(plan.queues),
            num_workers=plan.processes,
            worker_class=PipelineWorker,
            serializer=JSONSerializer,
        )
        self.plan = plan

    def get_worker_process(self, name, burst, _sleep=0, logging_level="INFO"):
        from rq.worker_pool import ForkProcess

        return ForkProcess(
            target=_pool_child,
            args=(name, list(self.plan.queues)),
            kwargs={
                "burst": burst,
                "logging_level": logging_level,
                "max_jobs": self.plan.max_jobs,
                "late_lanes": self.plan.late_lanes,
            },
            name=f"PipelineWorker {name} (pool {self.name})",
        )


def run(plan: Plan) -> int:
    """Exit status: 0 after a warm shutdown or a finished burst."""
    if plan.nice:
        # Before any worker forks: every one of them inherits it (recovered work's own workers yield the CPU).
        os.nice(plan.nice)
    log.info(
        "runworkers: %d process(es) on %s%s%s",
        plan.processes,
        ",".join(plan.queues),
        " (burst)" if plan.burst else "",
        f", recycled every {plan.max_jobs} jobs" if plan.max_jobs else "",
        extra={"action": "runworkers_start", "domain": "worker"},
    )
    # One process and nothing to respawn: the worker runs here (no supervisor process in between).
    if plan.processes == 1 and (plan.burst or plan.max_jobs is None):
        run_one(plan)
        return 0
    from django.db import connections

    connections.close_all()  # forked children must not share the parent's sockets
    pool = ProjectWorkerPool(plan)
    freeze_startup("worker")  # before the forks too: the children's collections then leave those pages shared
    pool.start(burst=plan.burst, logging_level=plan.logging_level)
    return 0
