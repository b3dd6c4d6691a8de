"""The last step of a clean stop: no thread writes while the interpreter finalizes.

Helper threads (sender pool, marker, the recovery child's report reader) are daemons; one still logging when
the main thread returns can hold stderr's buffer lock while the interpreter shuts down, and CPython then aborts
with "Fatal Python error: _enter_buffered_busy ... at interpreter shutdown" (seen once after SIGTERM). So,
after the supervisor's join: every other thread gets a bounded join; those still alive are named once in the
log, then logging is switched off and the streams flushed, so none of them can write any more.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

log = logging.getLogger("dispatch_app.runtime")


def quiesce(deadline: float = 2.0) -> list[str]:
    """Join the other threads for at most ``deadline`` seconds in all; returns the names still alive."""
    end = time.monotonic() + deadline
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is me or not thread.is_alive():
            continue
        thread.join(max(end - time.monotonic(), 0.0))
    alive = sorted(t.name for t in threading.enumerate() if t is not me and t.is_alive())
    if alive:
        log.info(
            "threads still alive at exit (daemons, silenced): %s",
            ", ".join(alive),
            extra={"action": "quiesce", "domain": "dispatch"},
        )
    logging.disable(logging.CRITICAL)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing left to protect
            pass
    return alive
