"""Our long-running commands' log lines are seen even where the project configured no logging.

A project made with ``startproject`` has no ``LOGGING`` for anything but ``django``: no handler takes a record of
ours, Python's last resort prints WARNING and above as bare messages (no time, no logger, no action) and INFO (a
dispatcher's start, a domain resumed, a recovery round's summary) nowhere. So when no handler would take a
``dispatch_app`` record (none on that logger or above it, the root included), ``rundispatcher``, ``runworkers`` and
``recover`` give the ``dispatch_app`` logger a stderr handler at INFO whose lines carry the time, level, logger and
the record's stable action and domain. Logging configured anywhere on that path is left as it is.
"""

from __future__ import annotations

import logging

LOGGER = "dispatch_app"
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class ActionFormatter(logging.Formatter):
    """The plain line, then ``action=... domain=...`` when the record names them (before any traceback)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        line = super().formatMessage(record)
        action = getattr(record, "action", None)
        if action is None:
            return line
        return f"{line} action={action} domain={getattr(record, 'domain', '')}"


def ensure_logging() -> logging.Handler | None:
    """Add the stderr handler when no handler would take our records; returns it (None: logging is configured)."""
    logger = logging.getLogger(LOGGER)
    if logger.hasHandlers():
        return None
    handler = logging.StreamHandler()
    handler.setFormatter(ActionFormatter(FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return handler
