"""Per live worker: what it serves, what it is doing, and whether it fails everything it touches.

A worker killed a moment ago keeps its hash until it expires; its PostgreSQL
session (``dispatch_app.db.liveness``) is gone at once: ``alive`` is False then.

Read from RQ's worker hashes (every RQ worker has one) plus the fields
PipelineWorker adds (its recent outcomes, undeserializable jobs). A worker that
fails every job - e.g. one that cannot read the jobs it is given - shows as
``failing_every_job`` on the dashboard and in ``manage.py dispatchstats``. Every value is read as input
anyone may have written: junk reads as unknown or 0, a key of another type as empty (``junk.replies``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

import redis
from rq import worker_registration
from rq.executions import WORKER_EXECUTIONS_KEY_TEMPLATE
from rq.utils import utcparse
from rq.worker import Worker

import dispatch_app.db.liveness as liveness
import dispatch_app.rq.junk as junk
from dispatch_app.config.tuning import FAILING_STREAK
from dispatch_app.rq.fields import LAST_ERROR_FIELD, RECENT_FIELD, UNDESERIALIZABLE_FIELD


@dataclass(frozen=True)
class WorkerHealth:
    name: str
    queues: list[str]
    state: str
    last_heartbeat: datetime | None
    heartbeat_age: float | None  # seconds, by Redis' own clock (TIME)
    current_job: str | None
    successful: int
    failed: int
    recent: str  # PipelineWorker only: last outcomes, oldest first: s(ucceeded) f(ailed) d(eserialisation failed)
    undeserializable: int
    last_error: str
    failing_every_job: bool
    pid: int | None
    hostname: str | None
    # Its PostgreSQL session (dispatch_app.db.liveness): False = gone, so the process is dead though its hash
    # has not expired yet; None = cannot be seen from here (judged by the heartbeat only).
    session_alive: bool | None = None
    # What recovery believes: its session if it can be seen, else its hash (it lives while the worker beats).
    alive: bool = True

    def as_dict(self) -> dict:
        data = asdict(self)
        data["last_heartbeat"] = self.last_heartbeat.isoformat() if self.last_heartbeat else None
        return data


def failing(recent: str, failed: int, successful: int) -> bool:
    """The last FAILING_STREAK outcomes all failed, or every job since the first undeserializable one has."""
    if recent:
        tail = recent[-FAILING_STREAK:]
        if len(tail) == FAILING_STREAK and "s" not in tail:
            return True
        return "d" in recent and "s" not in recent[recent.index("d") :]
    # A worker of another class: only its counters.
    return successful == 0 and failed >= FAILING_STREAK


def _text(data: dict, key: str) -> str:
    value = data.get(key.encode())
    return value.decode(errors="replace") if value is not None else ""


def _int(data: dict, key: str) -> int:
    try:
        return int(float(_text(data, key) or 0))
    except (ValueError, OverflowError):  # forged or corrupt ("abc", "nan", "inf"): a hash is input
        return 0


def _utc(text: str):
    try:
        return utcparse(text) if text else None
    except ValueError:
        return None


def workers(connection: redis.Redis) -> list[WorkerHealth]:
    """Every registered worker whose hash still exists (a dead one's hash expires), by name."""
    prefix = Worker.redis_worker_namespace_prefix
    try:
        members = connection.smembers(worker_registration.REDIS_WORKER_KEYS)
    except redis.ResponseError:  # the registry is no set (junk anyone may write; a worker resets it): none listed
        members = set()
    # Members are bytes anyone may write: read as text, never strictly decoded (RQ's get_keys raised on them).
    keys = sorted(k for k in {m.decode(errors="replace") for m in members} if k.startswith(prefix))
    if not keys:
        return []
    names = [k[len(prefix) :] for k in keys]
    with connection.pipeline(transaction=False) as pipe:
        pipe.time()
        for key, name in zip(keys, names, strict=True):
            pipe.hgetall(key)
            pipe.smembers(WORKER_EXECUTIONS_KEY_TEMPLATE.format(name))
        replies = junk.replies(pipe, "the workers' health")  # a key of another type reads as empty
    seconds, micros = replies[0]
    redis_now = datetime.fromtimestamp(seconds + micros / 1e6, tz=UTC)
    out = []
    claims: dict[str, str | None] = {}
    for i, name in enumerate(names):
        data, executions = replies[1 + 2 * i] or {}, replies[2 + 2 * i] or ()
        if not data or data.get(b"death"):
            continue
        last = _utc(_text(data, "last_heartbeat"))
        current = sorted(m.decode(errors="replace").split(":", 1)[0] for m in executions)
        successful, failed = _int(data, "successful_job_count"), _int(data, "failed_job_count")
        recent = _text(data, RECENT_FIELD)
        claims[name] = _text(data, liveness.WORKER_HASH_FIELD) or None
        out.append(
            WorkerHealth(
                name=name,
                queues=[q for q in _text(data, "queues").split(",") if q],
                state=_text(data, "state") or "?",
                last_heartbeat=last,
                heartbeat_age=round((redis_now - last).total_seconds(), 3) if last else None,
                current_job=current[0] if current else None,
                successful=successful,
                failed=failed,
                recent=recent,
                undeserializable=_int(data, UNDESERIALIZABLE_FIELD),
                last_error=_text(data, LAST_ERROR_FIELD),
                failing_every_job=failing(recent, failed, successful),
                pid=_int(data, "pid") or None,
                hostname=_text(data, "hostname") or None,
            )
        )
    sessions = liveness.judged(claims)
    return [replace(w, session_alive=sessions.get(w.name), alive=sessions.get(w.name) is not False) for w in out]


def snapshot(connection: redis.Redis | None = None) -> dict:
    """{"workers": [...as_dict()], "error": ""}; Redis being down is reported, not raised.

    Without a connection: the workers of every server a domain queue lives on (RQ_QUEUES); one server
    down is reported while the others' workers are still listed.
    """
    import dispatch_app.rq.servers as redis_servers
    from dispatch_app.domains import queue_names

    if connection is not None:
        targets = [("", connection)]
    else:
        targets = [(url, redis_servers.connection(url)) for url in redis_servers.by_server(queue_names())]
    found, errors = [], []
    for url, conn in targets:
        try:
            found.extend(w.as_dict() for w in workers(conn))
        except redis.RedisError as exc:
            where = f" ({redis_servers.label(url)})" if len(targets) > 1 else ""
            errors.append(f"Redis unavailable{where}: {type(exc).__name__}: {exc}")
    return {"workers": found, "error": "; ".join(errors)}


def render(snap: dict) -> list[str]:
    """The ``workers`` section of ``manage.py dispatchstats``, from ``snapshot()``."""
    lines = ["workers"]
    if snap.get("error"):
        return [*lines, f"  {snap['error']}"]
    if not snap["workers"]:
        return [*lines, "  none running"]
    for w in snap["workers"]:
        age = "-" if w["heartbeat_age"] is None else f"{w['heartbeat_age']:.0f}s"
        flag = "  FAILING EVERY JOB" if w["failing_every_job"] else ""
        if not w.get("alive", True):
            flag += "  DEAD (its PostgreSQL session is gone)"
        lines.append(
            f"  {w['name']}  {w['state']:<9} {','.join(w['queues'])}  heartbeat {age} ago  "
            f"ok {w['successful']} failed {w['failed']}  job {w['current_job'] or '-'}{flag}"
        )
        if w["failing_every_job"] and w["last_error"]:
            lines.append(f"    last error: {w['last_error']}")
    return lines
