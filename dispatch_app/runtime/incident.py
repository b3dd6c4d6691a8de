"""One log line per incident, not one per round.

A loop that fails every round while Redis or PostgreSQL is away would log the
same traceback once a second per loop (52 in one dispatcher's log in a 3 s
fault run). ``Incidents`` keeps one record per failure kind and process:

- the first failure of a kind is logged with its traceback (``<loop>_error``, or
  the loop's ``error_action``);
- while it lasts, rounds of any loop failing the same way are counted, and a
  summary ("still failing: N rounds since HH:MM:SS") is logged at most once per
  ``summary_every`` seconds (``incident_ongoing``);
- when no loop fails that way any more, one line says so (``incident_ended``).

"The same way" is the exception's class and message with its numbers blanked
(ports, pids, counters). The clocks are injected (monotonic for the rate,
wall for the "since" a reader compares with other logs), so tests need no sleep.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from dispatch_app.config.tuning import SUMMARY_EVERY

_NUMBERS = re.compile(r"\d+")


def signature(exc: BaseException) -> str:
    kind = type(exc)
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{kind.__module__}.{kind.__qualname__}: {_NUMBERS.sub('#', first)}"


@dataclass
class _Incident:
    signature: str
    since: float  # wall clock
    summarised_at: float  # monotonic
    rounds: int = 1
    loops: set[str] = field(default_factory=set)
    domain: str = ""


class Incidents:
    """Shared by a process's loop runners (thread-safe); ``PROCESS`` is the default one."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        summary_every: float = SUMMARY_EVERY,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.log = logger
        self.summary_every = summary_every
        self.clock = clock
        self.wall = wall
        self._lock = threading.Lock()
        self._open: dict[str, _Incident] = {}  # signature -> incident
        self._failing: dict[str, str] = {}  # loop -> the signature it fails with now

    def failed(self, loop: str, domain: str, exc: BaseException, message: str, *args, action: str = "") -> None:
        """A round of ``loop`` failed; ``message % args`` is the first line's text (the traceback follows it).

        ``action``: the first line's stable action name (default ``<loop>_error``).
        """
        sig = signature(exc)
        with self._lock:
            ended = self._leave(loop, keep=sig)
            incident = self._open.get(sig)
            first = incident is None
            if first:
                incident = self._open[sig] = _Incident(sig, self.wall(), self.clock(), domain=domain)
            else:
                incident.rounds += 1
            incident.loops.add(loop)
            self._failing[loop] = sig
            summary = not first and self.clock() - incident.summarised_at >= self.summary_every
            if summary:
                incident.summarised_at = self.clock()
            rounds, since, loops = incident.rounds, incident.since, sorted(incident.loops)
        if ended is not None:
            self._log_end(ended)
        if first:
            self.log.error(message, *args, exc_info=exc, extra={"action": action or f"{loop}_error", "domain": domain})
        elif summary:
            self.log.warning(
                "still failing: %d rounds since %s (%s; loops: %s)",
                rounds,
                _hms(since),
                sig,
                ", ".join(loops),
                extra={"action": "incident_ongoing", "domain": domain},
            )

    def succeeded(self, loop: str) -> None:
        with self._lock:
            if loop not in self._failing:
                return
            ended = self._leave(loop)
        if ended is not None:
            self._log_end(ended)

    def forget(self, loop: str) -> None:
        """``loop`` stopped: it fails no more, and says nothing about it (a stopped loop did not recover)."""
        with self._lock:
            self._leave(loop)

    def _leave(self, loop: str, keep: str | None = None) -> _Incident | None:
        """Take ``loop`` out of the incident it was failing with (unless that is ``keep``); the incident if it ended."""
        sig = self._failing.get(loop)
        if sig is None or sig == keep:
            return None
        del self._failing[loop]
        incident = self._open[sig]
        incident.loops.discard(loop)
        if incident.loops:
            return None
        del self._open[sig]
        return incident

    def _log_end(self, incident: _Incident) -> None:
        self.log.info(
            "no longer failing: %s (%d rounds since %s)",
            incident.signature,
            incident.rounds,
            _hms(incident.since),
            extra={"action": "incident_ended", "domain": incident.domain},
        )


def _hms(wall: float) -> str:
    return datetime.fromtimestamp(wall).strftime("%H:%M:%S")


PROCESS = Incidents(logging.getLogger("dispatch_app.runtime"))
