"""Conditional NOTIFY: writers announce new work only while some dispatcher is armed.

Every commit that called ``pg_notify`` takes PostgreSQL's cluster-wide notify
lock (``PreCommit_Notify``) until the commit is done, so notifying writers
commit one at a time. The envelope triggers therefore notify only while a row
of ``dispatch_app_notifyarm`` is armed (``armed_until`` ahead). A dispatcher
arms when it goes idle or finds only a trickle (two quiet scans in a row, each
claiming at most REARM_AT_CLAIMED first attempts), and
disarms when new work arrives faster than announced drains take it (one drain
claims DISARM_AT_CLAIMED first attempts): a busy dispatcher scans again after a
few milliseconds (POLL, a linger that lets batches gather) and needs no announcements.

The hand-over. A writer reads the arm state in its trigger and commits later.
If it read "not armed", its envelope must be found by a scan that starts after
its commit. Arming is therefore:

1. commit the arm (autocommit, one statement);
2. in a new statement, take the transactions in progress now (the xip of a
   fresh snapshot, minus those pg_stat_activity places in another database).
   A READ COMMITTED writer whose trigger read "not armed" had its xid before the
   arm committed (the INSERT precedes its AFTER trigger), so it has committed
   already or is in this list. Writers that read after the arm see it and
   notify. (Other isolation levels may read an older snapshot: the trigger
   makes them always notify.)
3. scan at once (HANDOVER): it finds every envelope committed so far;
4. the fence: while listed transactions remain, ``Wake.wait`` checks them
   between short steps (``pg_xact_status``); each time some have ended, one
   more HANDOVER scan finds what they committed. Nothing blocks on them, so a
   long unrelated transaction only keeps a cheap check going.

So every committed envelope is either announced or found by a scan of this
dispatcher, without writers ever contending on the arm state (a plain read).

Several dispatchers: any armed one suffices (every listener hears every
NOTIFY); a disarmed one never sleeps without arming first (unless its listener
is down: then it has only its ticks, as before, and says so in
productflow_missed_wakeups_total). A dispatcher that
dies armed keeps the writers notifying until its lease runs out
(NOTIFY_ARM_LEASE, at least 3 x POLL_INTERVAL); the live one renews at half
the lease, on its ticks. A lease found lapsed (a long pause) is a fresh arm,
with its fence and hand-over scan. Without a connected listener a dispatcher
does not arm: nobody would hear the announcements.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from django.db import DatabaseError, connection

from dispatch_app.config.tuning import DISARM_AT_CLAIMED, POLL_LINGER, QUIET_SCANS_TO_ARM
from dispatch_app.dispatch.wake import HANDOVER, POLL
from dispatch_app.store.api import ARM_SQL, DISARM_SQL, RENEW_SQL

log = logging.getLogger("dispatch_app.arming")

# The arm's own statements are the store's (store.arms): ARM_SQL, RENEW_SQL, DISARM_SQL.

# Run as its own statement after the arm committed, so its snapshot is later.
# A transaction pg_stat_activity cannot place (another role's, a prepared one)
# stays in the fence: waiting for it is only a check, never a block.
FENCE_SQL = """
SELECT coalesce(array_agg(x::text), '{}')
FROM pg_snapshot_xip(pg_current_snapshot()) AS x
WHERE NOT EXISTS (
    SELECT 1 FROM pg_stat_activity a
    WHERE a.backend_xid = xid(x)
      AND a.datid <> (SELECT oid FROM pg_database WHERE datname = current_database())
)
"""

STILL_RUNNING_SQL = (
    "SELECT coalesce(array_agg(x), '{}') FROM unnest(%(xids)s::text[]) AS x "
    "WHERE pg_xact_status(x::xid8) = 'in progress'"
)

# Fence checks: soon (writers commit within milliseconds), then backing off so a
# long transaction costs a few queries a second.
_FIRST_CHECK = 0.0005
_MAX_CHECK = 0.05
# A disarmed scan that found fewer first attempts than would disarm an armed drain is quiet: a trickle,
# which an announced drain serves at once instead of after POLL_LINGER. (A poll's count covers the linger
# as well as the drain, so the same count means a lower rate than in an armed drain.) Counting only empty
# scans, a dispatcher disarmed by one burst stayed disarmed at any rate where each linger gathers a job
# (one every 5 ms, 200/s): every new job then waited for the next poll (`dispatchbench recovery-storm`,
# its `off` variant: 441 of 445 drains were polls, new-job p50 15-19 ms).
REARM_AT_CLAIMED = DISARM_AT_CLAIMED - 1


def effective_lease(conf) -> float:
    """The renewal happens on ticks, so a lease shorter than a few ticks would lapse while idle."""
    return max(conf.NOTIFY_ARM_LEASE, 3 * conf.POLL_INTERVAL)


class Arming:
    """One dispatcher's arm state; every method runs on the dispatch loop's thread."""

    def __init__(
        self,
        conf,
        wake,
        *,
        listening: threading.Event | None = None,
        stop: threading.Event | None = None,
        process: str = "",
        clock=time.monotonic,
    ):
        self.conf = conf
        self.wake = wake
        self.listening = listening
        self.stop = stop
        self.process = process
        self.clock = clock
        self.lease = effective_lease(conf)
        self.token = uuid.uuid4()
        self.armed_until: float | None = None  # host-monotonic estimate, None = disarmed
        self.fence: list[str] = []
        self._next_check = 0.0
        self._poll_at: float | None = None  # disarmed and busy: when to scan again
        self._quiet_scans = QUIET_SCANS_TO_ARM  # since work was last found; a fresh dispatcher arms at once
        self._check_step = _FIRST_CHECK
        # For tests, the benchmark and the logs.
        self.arms = 0
        self.disarms = 0
        self.handovers = 0
        self.errors = 0

    @property
    def armed(self) -> bool:
        return self.armed_until is not None

    # -- the loop's side ---------------------------------------------------

    def drained(self, result) -> None:
        """Where a drain ends: decide whether this dispatcher needs announcements."""
        try:
            self._drained(result)
        except DatabaseError as exc:
            self._failed("drained", exc)

    def _drained(self, result) -> None:
        if self.stop is not None and self.stop.is_set():
            self.disarm()
            return
        if connection.in_atomic_block:
            # The fence must be read after the arm has committed: never arm inside a transaction.
            return
        if self.listening is not None and not self.listening.is_set():
            # Announcements nobody hears: the listener's catch-up scan covers its reconnect.
            self.disarm()
            return
        # A drain Redis refused is no sign of more work: rescanning at once would only refuse again.
        refused = getattr(result, "outage", "") or getattr(result, "transient_failures", 0)
        busy = result.claimed > 0 and not refused
        first = getattr(result, "claimed_first", result.claimed)
        if self.armed:
            if busy and first >= DISARM_AT_CLAIMED:
                # Commits arrive faster than announced drains take them: the writers are paying the
                # notify lock for announcements a busy dispatcher does not need. Fewer per drain (a few
                # hundred jobs/s) is cheap for the writers, and the announcement is what keeps commit ->
                # dispatched at a millisecond: a disarmed dispatcher waits POLL_LINGER between scans.
                self.disarm()
                self._quiet_scans = 0
                self._poll_at = self.clock() + POLL_LINGER
            else:
                self._renew_if_due()
        elif busy and first > REARM_AT_CLAIMED:
            # Rows keep coming: scan again soon without announcements. The short linger lets
            # a batch gather instead of claiming a few rows per round trip; it is paid only
            # under load, never by work arriving at an idle (armed) dispatcher.
            self._quiet_scans = 0
            self._poll_at = self.clock() + POLL_LINGER
        elif self._quiet_scans + 1 < QUIET_SCANS_TO_ARM:
            # One quiet scan (nothing, or a trickle) under load is often only a gap between commits;
            # arming for it would make every writer of the next few milliseconds take the notify lock.
            self._quiet_scans += 1
            self._poll_at = self.clock() + POLL_LINGER
        else:
            self.arm()

    def arm(self) -> None:
        """Arm, list the fence, scan at once (HANDOVER)."""
        with connection.cursor() as cursor:
            cursor.execute(ARM_SQL, {"token": self.token, "process": self.process, "lease": self.lease})
            (remaining,) = cursor.fetchone()
            self.armed_until = self.clock() + remaining
            cursor.execute(FENCE_SQL)
            (xids,) = cursor.fetchone()
        self.arms += 1
        self._quiet_scans = QUIET_SCANS_TO_ARM
        self.fence = list(xids)
        self._check_step = _FIRST_CHECK
        self._next_check = self.clock() + self._check_step
        self.handovers += 1
        self.wake.set(HANDOVER)

    def _renew_if_due(self) -> None:
        now = self.clock()
        if now < self.armed_until - self.lease / 2:
            return
        remaining = None
        if now < self.armed_until:
            with connection.cursor() as cursor:
                cursor.execute(RENEW_SQL, {"token": self.token, "lease": self.lease})
                row = cursor.fetchone()
            remaining = row[0] if row else None
        if remaining is None:
            log.info(
                "notify arm lapsed before its renewal; arming afresh",
                extra={"action": "notify_arm_lapsed", "domain": "dispatch"},
            )
            self.arm()
        else:
            self.armed_until = self.clock() + remaining

    def disarm(self) -> None:
        self.fence = []
        self._poll_at = None
        if self.armed_until is None:
            return
        self.armed_until = None
        self.disarms += 1
        with connection.cursor() as cursor:
            cursor.execute(DISARM_SQL, {"token": self.token})

    def stopped(self) -> None:
        """The loop was told to stop while it waited: writers need not notify for it any more."""
        try:
            self.disarm()
        except DatabaseError as exc:
            # The lease runs out by itself.
            self._failed("stopped", exc)

    # -- the wait's side (Wake.wait) -------------------------------------------

    def due_in(self) -> float | None:
        """Seconds until this arming wants a scan or a fence check, or None when it waits for nothing."""
        dues = [t for t in (self._poll_at, self._next_check if self.fence else None) if t is not None]
        if not dues:
            return None
        return max(0.0, min(dues) - self.clock())

    def due(self) -> str | None:
        """Called by Wake.wait when ``due_in`` has passed: the scan reason it owes, or None."""
        if self._poll_at is not None and self.clock() >= self._poll_at:
            self._poll_at = None
            return POLL
        return HANDOVER if self.check_fence() else None

    def check_fence(self) -> bool:
        """True when some fenced transactions have ended since the last check: scan for what they committed."""
        if not self.fence or self.clock() < self._next_check:
            return False
        try:
            with connection.cursor() as cursor:
                cursor.execute(STILL_RUNNING_SQL, {"xids": self.fence})
                (running,) = cursor.fetchone()
        except DatabaseError as exc:
            # Cannot tell what ended: scan now; the fallback tick covers the rest.
            self._failed("fence", exc)
            self.handovers += 1
            return True
        ended = len(running) < len(self.fence)
        self.fence = list(running)
        self._check_step = _FIRST_CHECK if ended else min(self._check_step * 2, _MAX_CHECK)
        self._next_check = self.clock() + self._check_step
        if ended:
            self.handovers += 1
        return ended

    def _failed(self, where: str, exc: Exception) -> None:
        # Believing ourselves disarmed is the safe side: the next idle drain arms again.
        self.errors += 1
        self.armed_until = None
        self.fence = []
        self._poll_at = None
        log.warning(
            "notify arming failed in %s: %s",
            where,
            exc,
            extra={"action": "notify_arm_error", "domain": "dispatch"},
        )
