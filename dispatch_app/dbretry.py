"""One retry on a fresh connection, for a statement whose session may have died since the last one.

A worker's connection can die while it works (a terminated backend, a network
cut, PostgreSQL restarting). Work that is already done — an outcome, a vendor
call's answer — or work about to start must not be lost or failed for that:
its statement is run once more on a new connection. Only outside a
transaction: inside one, the statements before it died with the session, so
the error is raised for the transaction's owner to handle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection

from dispatch_app import prepared

T = TypeVar("T")


def once_more_on_fresh_connection(run: Callable[..., T], log: logging.Logger, message: str, *args, action: str) -> T:
    """``run(cursor, retry)`` on the default connection; if it dies, once more on a fresh one.

    ``retry`` is True on the second try (a statement whose first commit may have
    been lost with its answer can look for it first). The retry is logged as a
    warning with ``message % args`` and ``action``; a second failure is raised.
    """
    for retry in (False, True):
        try:
            with prepared.cursor() as cursor:  # every caller's statement is a per-job one
                return run(cursor, retry)
        except (OperationalError, InterfaceError):
            if retry or connection.in_atomic_block:
                raise
            log.warning(message, *args, extra={"action": action, "domain": "worker"})
            connection.close()
    raise AssertionError("unreachable")
