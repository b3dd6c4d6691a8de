"""The refusal counter: how many taken jobs the workers refused, per kind, on each Redis server (one per deployment).

Written by the worker's admission (``rq.worker.admission``: one script that also resets junk in it), read here by
the dashboard's banner, ``dispatchstats`` and the ``productflow_rq_jobs_refused`` metric. Anyone on Redis's network
can write the key, so reading it tolerates anything (``totals``).
"""

from __future__ import annotations

import logging

import redis

import dispatch_app.rq.servers as redis_servers
from dispatch_app.domains import all_domains
from dispatch_app.rq.deployment import namespace

log = logging.getLogger("dispatch_app.rqworker")

# The refusals on one Redis server (a hash, one per deployment: ``refused_key()``): count, kind:<kind> counts,
# last_func, last_kind, last_at, resets.
REFUSED_KEY = "productflow:{namespace}:refused"
# The count (and the dashboard's banner) lasts this long after the last refusal; the refused jobs stay
# in RQ's failed registry as long.
REFUSED_TTL = 7 * 86_400
FUNC_SHOWN_MAX = 200

UNREADABLE = "unreadable"  # the hash or its call data is not what RQ writes for a JSON job
NOT_AN_ENTRY_POINT = "not_an_entry_point"  # the function is not a declared domain's task_path
BAD_ARGUMENTS = "bad_arguments"  # not exactly (job_id, attempt)
BAD_ID = "bad_id"  # the RQ id is not the one the dispatcher gives that (job, attempt)
WRONG_QUEUE = "wrong_queue"  # taken from (or naming) a queue that is not a lane of the domain's queue
EXTRAS = "extras"  # callbacks, dependencies, repeats, retries, webhooks, rate limit
UNSIGNED = "unsigned"  # no signature of this deployment's dispatcher: a hash it did not write
KINDS = (UNREADABLE, NOT_AN_ENTRY_POINT, BAD_ARGUMENTS, BAD_ID, WRONG_QUEUE, EXTRAS, UNSIGNED)


def refused_key() -> str:
    """This deployment's refusal counter (dispatch_app.rq.deployment): another's on the same server is not ours."""
    return REFUSED_KEY.format(namespace=namespace())


def totals(conn: redis.Redis | None = None) -> dict:
    """Refusals over every server the declared queues live on (``conn``: that one only).

    {"count", "kinds": {kind: n}, "resets", "last_func", "last_kind", "last_at", "error"}; never raises for Redis
    trouble. Only the fields the counter writes are read (a hash swollen with junk fields costs nothing), a value
    that is no count reads as 0, and a key of another type as no refusals (the next refusal resets it).
    """
    servers = [conn] if conn is not None else None
    if servers is None:
        urls = redis_servers.by_server(dict.fromkeys(d.queue for d in all_domains()))
        servers = [redis_servers.connection(url) for url in urls]
    out = {"count": 0, "kinds": {}, "resets": 0, "last_func": "", "last_kind": "", "last_at": "", "error": ""}
    names = ["count", "resets", "last_func", "last_kind", "last_at", *(f"kind:{kind}" for kind in KINDS)]
    key = refused_key()
    for server in servers:
        try:
            raw = server.hmget(key, names)
        except redis.ResponseError as exc:  # WRONGTYPE: junk anyone may write; the next refusal resets it
            out["error"] = f"{key} is not a hash ({str(exc)[:200]}); the next refusal resets it"
            log.warning(
                "the refusal counter %s holds junk (%s); read as no refusals until the next refusal resets it",
                key,
                str(exc)[:200],
                extra={"action": "refused_counter_unreadable", "domain": "worker"},
            )
            continue
        except redis.RedisError as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            continue
        fields = {
            n: v.decode(errors="replace")[:FUNC_SHOWN_MAX] for n, v in zip(names, raw, strict=True) if v is not None
        }
        out["count"] += _int(fields.get("count"))
        out["resets"] += _int(fields.get("resets"))
        for name, value in fields.items():
            if name.startswith("kind:"):
                out["kinds"][name[5:]] = out["kinds"].get(name[5:], 0) + _int(value)
        if fields.get("last_at", "") > out["last_at"]:
            out.update(last_func=fields.get("last_func", ""), last_kind=fields.get("last_kind", ""))
            out["last_at"] = fields["last_at"]
    return out


def _int(value) -> int:
    """A count as the counter writes it (1-18 digits); anything else (junk anyone may write) is 0."""
    text = value.strip() if isinstance(value, str) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else 0
