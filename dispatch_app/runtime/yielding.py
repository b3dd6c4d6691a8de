"""Recovery yields to new work: a round starts only when the outbox has no backlog waiting for the dispatcher.

A recovery round re-dispatches through the outbox, so its envelopes join the
batches new jobs are claimed in. Started while the dispatcher is behind, a
round's burst lands on top of a backlog new jobs already wait in. So, in the
recovery child (the default deployment), each domain's loop looks before a
round: while some envelope has been due for longer than ``BACKLOG_GRACE`` (the
dispatcher is behind), the round waits, checking every ``CHECK_INTERVAL``, for
at most ``max_yield`` (the loop's own period): recovery can be slowed by new
work, at most to half its rate, never stopped. One indexed look per check
(the claim's partial indexes, paused domains left out as the claim leaves them).
Envelopes given back during a Redis outage are not due (their delay), so an
outage does not hold recovery back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import Error, connection

from dispatch_app.config.tuning import BACKLOG_GRACE, CHECK_INTERVAL

log = logging.getLogger("dispatch_app.runtime")


# One look per claim index (first attempts, later ones: dispatch_app.store.claim). The clock is read
# once per half (a sub-select): compared with the bare volatile clock_timestamp(), available_at would be a
# filter on every pending envelope of the index (all the delayed retries when there is no backlog).
BACKLOG_SQL = """
SELECT EXISTS (
    SELECT 1 FROM dispatch_app_dispatchenvelope
    WHERE status = 'pending' AND attempt = 1
      AND available_at <= (SELECT clock_timestamp() - make_interval(secs => %(grace)s))
      AND domain NOT IN (SELECT domain FROM dispatch_app_domainpause)
) OR EXISTS (
    SELECT 1 FROM dispatch_app_dispatchenvelope
    WHERE status = 'pending' AND attempt > 1
      AND available_at <= (SELECT clock_timestamp() - make_interval(secs => %(grace)s))
      AND domain NOT IN (SELECT domain FROM dispatch_app_domainpause)
)
"""


def outbox_backlog(grace: float = BACKLOG_GRACE) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(BACKLOG_SQL, {"grace": grace})
        return bool(cursor.fetchone()[0])


class YieldingWait:
    """A recovery loop's waiter (``RecoveryLoop(waiter=...)``): its pause, then yield while the outbox has a backlog.

    ``waiter(timeout) -> True`` when stopped. ``yields`` and ``yielded_seconds``
    count the rounds held back and for how long (tests, the benchmark).
    """

    def __init__(
        self,
        stop: threading.Event,
        max_yield: float,
        *,
        backlog: Callable[[], bool] = outbox_backlog,
        check_interval: float = CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stop = stop
        self.max_yield = max_yield
        self.backlog = backlog
        self.check_interval = check_interval
        self.clock = clock
        self.yields = 0
        self.yielded_seconds = 0.0

    def __call__(self, timeout: float) -> bool:
        if self.stop.wait(timeout):
            return True
        started = self.clock()
        deadline = started + self.max_yield
        held = False
        try:
            while self.clock() < deadline and self.backlog():
                held = True
                if self.stop.wait(self.check_interval):
                    return True
        except Error:
            # The round itself meets the broken database and reports it; looking must not hide it.
            connection.close()
        finally:
            if held:
                self.yields += 1
                self.yielded_seconds += self.clock() - started
        return False
