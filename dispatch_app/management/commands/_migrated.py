"""The commands that run the pipeline refuse an unmigrated database up front, naming what to run.

Without this, the first statement fails deep in a loop ('relation "dispatch_app_..." does not exist')
after the processes have started, and ``manage.py demo`` says only that a child exited.

The check is the first thing a (re)started dispatcher or worker asks the database, so it meets the
database's passing failures too (a terminated backend, PostgreSQL restarting, a full connection
table): those are waited out with backoff for up to ``wait`` seconds, as the loops wait them out
later, instead of ending the process (a supervisor would restart it into the same window). A
database that cannot be right without a change (no such database or role, refused credentials)
is said at once.
"""

from __future__ import annotations

import logging
import time

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.db.migrations.executor import MigrationExecutor

from dispatch_app.config.tuning import STARTUP_DB_WAIT

log = logging.getLogger("dispatch_app.startup")

RETRY_FIRST, RETRY_MAX = 0.1, 2.0
# libpq reports connection-time refusals as text only (no SQLSTATE): these need a change of settings.
PERMANENT = ("does not exist", "authentication failed", "no pg_hba.conf entry", "password")


def unapplied(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    """``app.migration`` names not yet applied to the database, in the order migrate would apply them."""
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, backwards in plan if not backwards]


def require_migrated(
    alias: str = DEFAULT_DB_ALIAS, *, wait: float = STARTUP_DB_WAIT, sleep=time.sleep, clock=time.monotonic
) -> None:
    missing = answered(lambda: unapplied(alias), alias, wait=wait, sleep=sleep, clock=clock)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CommandError(
            f"the database has {len(missing)} unapplied migration(s) ({shown}): run `python manage.py migrate` first"
        )


def answered(
    ask, alias: str = DEFAULT_DB_ALIAS, *, wait: float = STARTUP_DB_WAIT, sleep=time.sleep, clock=time.monotonic
):
    """``ask()``'s answer, a start-up question to the database: its passing failures (a restart, a terminated
    backend) waited out with backoff for up to ``wait`` s, a refusal that needs a change of settings said at once."""
    deadline = clock() + wait
    delay = RETRY_FIRST
    while True:
        try:
            return ask()
        except (OperationalError, InterfaceError) as exc:
            connections[alias].close()  # the next try connects afresh
            error = " ".join(str(exc).split())
            if any(phrase in error for phrase in PERMANENT):
                raise CommandError(f"the database refused the start-up check: {error}") from exc
            left = deadline - clock()
            if left <= 0:
                raise CommandError(f"the database did not answer the start-up check for {wait:g} s: {error}") from exc
            log.warning(
                "database unavailable at start-up (%s); checking again in %.1f s",
                error,
                min(delay, left),
                extra={"action": "startup_db_retry", "domain": "startup"},
            )
            sleep(min(delay, left))
            delay = min(delay * 2, RETRY_MAX)
