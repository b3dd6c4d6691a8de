"""What woke a long-running loop: the trigger names every loop run by ``runtime.runner.LoopRunner`` shares.

The dispatch loop has more of its own (``dispatch.wake``: a NOTIFY, a hand-over, a due time, ...).
"""

from __future__ import annotations

TICK = "tick"  # its period passed
STOP = "stop"  # the process is stopping: the loop returns
