"""A hostile Redis writer (scenario 47): forged jobs of every kind, into every queue given, until stopped.

    python -m tests.acceptance.faults.hostile_writer <redis url> <summary file> <canary file> <rounds> \
        <queue>... -- <queue:entry domain:job id>...

Anyone who can write to Redis can do this (it needs no Django, only rq and redis). Each round writes,
into each queue: a call of ``os.system`` and of the canary function (``tests.canary.touch``), the
project's own entry point with callbacks, a dependency, repeats, retries, keyword arguments, an RQ id
the dispatcher would not give, another domain's entry point, a pickled call, a hash RQ cannot read, and
an id no RQ job can have (not RQ's alphabet, not UTF-8).
Real jobs are named too, by the RQ id the dispatcher gives them (``queue:entry domain:job id``; the namespace
from ``PF_NAMESPACE``), exactly as the dispatcher would write them but for its signature (a job scheduled for
later; a job of another domain named through this queue's entry point). Last, for RQ's maintenance rather
than a take, each queue's intermediate list gets an unreadable hash and its started registry an abandoned
forgery whose failure callback is the canary. Any forged call that ran would create the canary file. The
summary (JSON) says how many jobs were written into each queue ("written") and what was planted for maintenance
("planted").
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import redis
from rq import Callback, Queue, Repeat, Retry
from rq.job import Job
from rq.serializers import JSONSerializer

CANARY = "tests.canary.touch"
# The deployment's namespace, as anyone reading its Redis sees it in the ids there (dispatch_app.rq.ids).
NAMESPACE = os.environ["PF_NAMESPACE"]


def rq_job_id(job_id: int, attempt: int) -> str:
    """The id the dispatcher gives this attempt (its hash signed; these forgeries are not)."""
    return f"pf-{NAMESPACE}-{job_id}-{attempt}"


def forge(conn: redis.Redis, queue: str, domain: str, other: str, canary: str) -> int:
    """One round of forgeries into ``queue`` (of ``domain``); how many jobs it put there."""
    q = Queue(queue, connection=conn, serializer=JSONSerializer)
    pickled = Queue(queue, connection=conn)  # RQ's default serializer: pickle
    entry, wrong_entry = f"dispatch_app.run.{domain}", f"dispatch_app.run.{other}"
    n = 10**9 + uuid.uuid4().int % 10**8  # a job id PostgreSQL never gave
    forged = [
        lambda: q.enqueue("os.system", f"touch {canary}"),
        lambda: q.enqueue(CANARY, "direct"),
        lambda: q.enqueue(
            entry, n, 1, job_id=rq_job_id(n, 1), on_success=Callback(CANARY), on_failure=Callback(CANARY)
        ),
        lambda: q.enqueue(entry, n, 2, job_id=rq_job_id(n, 2), on_stopped=Callback(CANARY)),
        lambda: q.enqueue(entry, n, 3, job_id=rq_job_id(n, 3), repeat=Repeat(times=2)),
        lambda: q.enqueue(entry, n, 4, job_id=rq_job_id(n, 4), retry=Retry(max=2)),
        lambda: q.enqueue(entry, n, 5, job_id=rq_job_id(n, 5), note="kwargs"),
        lambda: q.enqueue(entry, n, 6, job_id=rq_job_id(n, 7)),  # not the id the dispatcher gives (n, 6)
        lambda: q.enqueue(wrong_entry, n, 8, job_id=rq_job_id(n, 8)),  # another domain's entry in this queue
        lambda: pickled.enqueue(CANARY, "pickled", job_id=rq_job_id(n, 9)),
    ]
    for make in forged:
        make()
    # A job with a dependency (RQ would defer it until the dependency ends): its hash, pushed by hand.
    dependent = Job.create(
        entry,
        args=(n, 10),
        id=rq_job_id(n, 10),
        depends_on=[rq_job_id(n, 11)],
        connection=conn,
        serializer=JSONSerializer,
    )
    dependent.origin = queue
    dependent.save()
    q.push_job_id(dependent.id)
    # A hash RQ's own code cannot read at all.
    garbage = f"forged-{uuid.uuid4().hex}"
    conn.hset(f"rq:job:{garbage}", mapping={"data": b"\x80\x04garbage", "timeout": b"never", "status": b"?"})
    q.push_job_id(garbage)
    # An id no RQ job can have (RQ's Job(id) raises on it), with a hash under it so the take returns it.
    malformed = f"forged {uuid.uuid4().hex}!".encode() + b"\xff"
    conn.hset(b"rq:job:" + malformed, mapping={"status": "queued", "origin": queue, "data": "x"})
    conn.rpush(q.key, malformed)
    return len(forged) + 3


def plant(conn: redis.Redis, queue: str) -> dict[str, str]:
    """What RQ's maintenance reads rather than a take: an unreadable hash in the queue's intermediate list, and
    an abandoned "started" forgery (expired in the started registry) whose failure callback is the canary."""
    q = Queue(queue, connection=conn, serializer=JSONSerializer)
    unreadable = f"forged-{uuid.uuid4().hex}"
    conn.hset(f"rq:job:{unreadable}", mapping={"data": b"\x80\x04garbage", "timeout": b"never", "status": b"?"})
    conn.rpush(q.intermediate_queue_key, unreadable)
    abandoned = Job.create(
        CANARY, args=("abandoned",), connection=conn, serializer=JSONSerializer, on_failure=Callback(CANARY)
    )
    abandoned.origin = queue
    abandoned.set_status("started")
    abandoned.save()
    conn.zadd(f"rq:wip:{queue}", {f"{abandoned.id}:forged": 1})
    return {"unreadable": unreadable, "abandoned": abandoned.id}


def name_real_jobs(conn: redis.Redis, named: list[str]) -> dict[str, int]:
    """``queue:entry domain:job id``: the job's RQ id as the dispatcher gives it, through that entry point."""
    counts: dict[str, int] = {}
    for spec in named:
        queue, entry_domain, job_id = spec.split(":")
        Queue(queue, connection=conn, serializer=JSONSerializer).enqueue(
            f"dispatch_app.run.{entry_domain}", int(job_id), 1, job_id=rq_job_id(int(job_id), 1)
        )
        counts[queue] = counts.get(queue, 0) + 1
    return counts


def main(argv: list[str]) -> None:
    url, summary, canary, rounds, *rest = argv
    split = rest.index("--")
    queues, named = rest[:split], rest[split + 1 :]
    conn = redis.Redis.from_url(url)
    domains = [q.split(".")[0] for q in queues]
    counts = {queue: 0 for queue in queues}
    for queue, n in name_real_jobs(conn, named).items():
        counts[queue] = counts.get(queue, 0) + n
    for _ in range(int(rounds)):
        for queue, domain in zip(queues, domains, strict=True):
            other = next(d for d in domains if d != domain)
            counts[queue] += forge(conn, queue, domain, other, canary)
        time.sleep(0.2)
    planted = {queue: plant(conn, queue) for queue in queues}
    with open(summary, "w") as f:
        json.dump({"written": counts, "planted": planted}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
