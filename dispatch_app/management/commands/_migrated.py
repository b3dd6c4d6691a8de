"""The commands that run the pipeline refuse an unmigrated database up front, naming what to run.

Without this, the first statement fails deep in a loop ('relation "dispatch_app_..." does not exist')
after the processes have started, and ``manage.py demo`` says only that a child exited.
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor


def unapplied(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    """``app.migration`` names not yet applied to the database, in the order migrate would apply them."""
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, backwards in plan if not backwards]


def require_migrated(alias: str = DEFAULT_DB_ALIAS) -> None:
    missing = unapplied(alias)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CommandError(
            f"the database has {len(missing)} unapplied migration(s) ({shown}): run `python manage.py migrate` first"
        )
