"""Retries on a fresh connection, for a statement that records what already happened.

A worker's connection can die while it works (a terminated backend, a network
cut, PostgreSQL restarting or crashing). What is already done — an outcome, a
vendor call's answer — or a call about to be made must not be lost or failed
for that: the statement is run again on a new connection, at once (a terminated
backend: the next connection works), then with backoff while the server is
away, for up to ``WORKER_DB_OUTAGE_WAIT`` seconds. Only the worker knows what
the vendor answered; giving up at the first refusal turned a PostgreSQL restart
into ``outcome_unknown`` for every call in flight (scenario 41). Only outside a
transaction: inside one, the statements before it died with the session, so
the error is raised for the transaction's owner to handle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection

import dispatch_app.db.prepared as prepared
from dispatch_app.config.settings import dispatch_settings

T = TypeVar("T")

RETRY_FIRST, RETRY_MAX = 0.1, 2.0


def on_fresh_connections(
    run: Callable[..., T],
    log: logging.Logger,
    message: str,
    *args,
    action: str,
    wait: float | None = None,
    sleep=time.sleep,
    clock=time.monotonic,
) -> T:
    """``run(cursor, retry)`` on the default connection; if it dies, again on fresh ones until ``wait`` is spent.

    ``retry`` is True from the second try on (a statement whose first commit may
    have been lost with its answer can look for it first). The first retry is
    logged as a warning with ``message % args`` and ``action``; the failure
    that outlasts ``wait`` (default: WORKER_DB_OUTAGE_WAIT) is raised.
    """
    deadline = None
    delay = RETRY_FIRST
    tries = 0
    while True:
        try:
            with prepared.cursor() as cursor:  # every caller's statement is a per-job one
                return run(cursor, tries > 0)
        except (OperationalError, InterfaceError):
            if connection.in_atomic_block:
                raise
            connection.close()
            if deadline is None:
                if wait is None:
                    wait = dispatch_settings().WORKER_DB_OUTAGE_WAIT
                deadline = clock() + wait
                log.warning(message, *args, extra={"action": action, "domain": "worker"})
            elif clock() >= deadline:
                raise
            else:
                sleep(min(delay, max(0.0, deadline - clock())))
                delay = min(delay * 2, RETRY_MAX)
            tries += 1
