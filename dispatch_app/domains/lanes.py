"""Lanes: each domain queue is a few RQ queues, taken by the workers in a fixed order.

RQ queues are FIFO, so a re-dispatch sent into the queue new jobs use lands
ahead of every new job committed after it: a recovery round's batch runs back
to back at the worker while new jobs wait behind it. A lane is an RQ queue of
its own beside the domain's queue; the worker takes the first lane before the
next (``rq.worker.fetch``), so what goes into a later lane never waits in front
of what goes into an earlier one.

- ``new`` is the domain's queue itself (its name unchanged): first attempts,
  and operator retries (a person is waiting for them).
- ``recovery`` (``<queue>.recovery``): everything recovery re-dispatches
  (its loops and ``recover --once``) and a retry after a failed attempt: work
  that is already late and must not make new work late too.

A lane lives on its domain queue's Redis server (the same ``RQ_QUEUES`` entry).
The dot cannot appear in a domain queue's name, so a lane never collides with
a declared queue. Priorities are meant to become more lanes in this order.
"""

from __future__ import annotations

NEW = "new"
RECOVERY = "recovery"
# The worker's take order.
LANES = (NEW, RECOVERY)
SEPARATOR = "."

# Which lane a re-dispatch goes to, by the event kind that records it.
_KIND_LANES = {
    "operator_retry_now": NEW,
    "operator_redispatch": NEW,
    "retry_after_failure": RECOVERY,
    "recovery_redispatch": RECOVERY,
}


class UnknownLane(ValueError):
    pass


def queue_name(queue: str, lane: str = NEW) -> str:
    """The RQ queue of ``queue``'s ``lane``."""
    if lane == NEW:
        return queue
    if lane not in LANES:
        raise UnknownLane(f"unknown lane {lane!r}; lanes: {', '.join(LANES)}")
    return f"{queue}{SEPARATOR}{lane}"


def split(name: str) -> tuple[str, str]:
    """(domain queue, lane) of an RQ queue name; a name without a lane suffix is the ``new`` lane."""
    base, sep, lane = name.rpartition(SEPARATOR)
    if sep and lane in LANES and lane != NEW and base:
        return base, lane
    return name, NEW


def queues(queue: str) -> tuple[str, ...]:
    """Every lane of a domain queue, in the worker's take order."""
    return tuple(queue_name(queue, lane) for lane in LANES)


def for_kind(kind: str) -> str:
    """The lane a re-dispatch recorded as ``kind`` goes to; an unknown kind is treated as recovered work."""
    return _KIND_LANES.get(kind, RECOVERY)


def is_late(name: str) -> bool:
    """True for a lane after ``new`` (work the worker takes only when no new work is waiting, or at its share)."""
    return split(name)[1] != NEW
