"""Which lanes a PipelineWorker takes from, and the late lanes' share (``dispatch_app.domains.lanes``).

New work is taken first; a late lane's job only alone and when no new work was there, so new work
waits behind at most the one late job running. Under saturation of both, one job in every
RECOVERY_LANE_EVERY is a late one: recovered work still moves, at that share.
"""

from __future__ import annotations

import dispatch_app.domains.lanes as lanes
from dispatch_app.domains import queue_names


def with_lanes(queues) -> list:
    """A domain queue named alone brings its late lanes (``domains.lanes``); a lane named alone stays alone."""
    declared = set(queue_names())
    given = list(queues) if isinstance(queues, list | tuple) else [queues]
    names = {q if isinstance(q, str) else q.name for q in given}
    out = []
    for queue in given:
        out.append(queue)
        name = queue if isinstance(queue, str) else queue.name
        if name in declared:
            out += [lane for lane in lanes.queues(name)[1:] if lane not in names]
    return out


class LaneShare:
    """The 1-in-``every`` rule, counted over the jobs a worker takes; ``has_late``: it serves a late lane."""

    def __init__(self, every: int, has_late: bool = False):
        self.every = every
        self.has_late = has_late
        self.new_since_late = 0  # new-lane jobs taken since the last late-lane one (the late lanes' share)
        # Late work may be waiting until a take that looked there first found none: until then the new
        # lanes are taken in runs that leave room for the share.
        self.late_waiting = True

    def late_due(self) -> bool:
        """After ``RECOVERY_LANE_EVERY - 1`` new jobs in a row, a late job (if any) goes first."""
        return self.has_late and self.new_since_late >= self.every - 1

    def limit(self, limit: int) -> int:
        """A take of new work stops where the late lanes' share falls due, while late work may be waiting."""
        if not (self.late_waiting and self.has_late):
            return limit
        return max(1, min(limit, self.every - 1 - self.new_since_late))

    def count(self, queue_names: list[str], late_first: bool) -> None:
        """A take's jobs, by the queue each came from, in order."""
        late = any(lanes.is_late(name) for name in queue_names)
        if late or late_first:
            self.late_waiting = late
        for name in queue_names:
            self.new_since_late = 0 if lanes.is_late(name) else self.new_since_late + 1
