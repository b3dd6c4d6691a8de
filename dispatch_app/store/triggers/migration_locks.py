"""Our migrations wait a bounded time for their locks, and try again, instead of stopping every submit behind them.

A migration that replaces a trigger or alters a table of ours asks PostgreSQL for a lock that conflicts with every
reader or writer of it (``DROP TRIGGER``: ACCESS EXCLUSIVE). Behind a long transaction (a report, a hung client) that
request waits, and every later submit, claim and start queues behind the request: an upgrade becomes an outage for
as long as that transaction lasts. So each transactional migration of ours runs with ``lock_timeout`` at most
``MIGRATION_LOCK_TIMEOUT_MS`` (a shorter bound the session already has is kept), inside a savepoint: a lock wait that
runs out rolls the savepoint back, which releases every lock the attempt took, waits a little and tries again, up to
``MIGRATION_LOCK_TRIES`` times. The last failure names the migration and the sessions holding locks on the tables it
needed; nothing of it is left applied. What the migration defers to its end (an index, a foreign key) runs inside
the same savepoint, so a lock wait there is retried too.

Non-transactional migrations (``CONCURRENTLY``) are the other way round: they stop no writer, but they wait for every
older transaction to end and take as long as the table is big. Cut by a session's ``lock_timeout`` or
``statement_timeout`` (this repository's settings give 5 s and 30 s) they fail half-way and leave an invalid index
behind, which the next ``migrate`` trips over. So they run with both unset, restored afterwards.

Every migration of ``dispatch_app`` subclasses ``BoundedMigration`` (a unit test checks), so a future one cannot
forget. ``sqlmigrate`` and other databases run the plain ``Migration``.
"""

from __future__ import annotations

import time

from django.db import OperationalError, migrations, transaction

from dispatch_app.config.tuning import MIGRATION_LOCK_BACKOFF, MIGRATION_LOCK_TIMEOUT_MS, MIGRATION_LOCK_TRIES

LOCK_NOT_AVAILABLE = "55P03"
APP_TABLES_LIKE = "dispatch\\_app\\_%"

# Takes the smaller of the session's bound and ours (0 is no bound); local to the migration's transaction.
BOUND_SQL = """
SELECT set_config('lock_timeout', CASE
    WHEN current_setting('lock_timeout') IN ('0', '0ms') THEN %(ms)s
    ELSE least(%(ms)s::int, (extract(epoch FROM current_setting('lock_timeout')::interval) * 1000)::int)::text
END, true)
"""
UNBOUND_SQL = (
    "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'), "
    "set_config('lock_timeout', '0', false), set_config('statement_timeout', '0', false)"
)
RESTORE_SQL = "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)"
HOLDERS_SQL = r"""
SELECT DISTINCT a.pid, a.state, date_trunc('second', clock_timestamp() - a.xact_start), left(a.query, 120)
FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_stat_activity a ON a.pid = l.pid
WHERE c.relname LIKE %s AND l.pid <> pg_backend_pid() AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY 1
"""

sleep = time.sleep  # a test replaces it to act between two tries


class MigrationLockTimeout(OperationalError):
    """A migration of ours gave up waiting for its locks; nothing of it was applied."""


class BoundedMigration(migrations.Migration):
    """``migrations.Migration`` whose lock waits are bounded and retried (module docstring)."""

    def apply(self, project_state, schema_editor, collect_sql=False):
        return self._bounded(super().apply, project_state, schema_editor, collect_sql)

    def unapply(self, project_state, schema_editor, collect_sql=False):
        return self._bounded(super().unapply, project_state, schema_editor, collect_sql)

    def _bounded(self, run, project_state, schema_editor, collect_sql):
        connection = schema_editor.connection
        if collect_sql or connection.vendor != "postgresql":
            return run(project_state, schema_editor, collect_sql)
        if not self.atomic:
            return self._unbounded(run, project_state, schema_editor)
        if not connection.in_atomic_block:  # an atomic migration on a connection that cannot run DDL in transactions
            return run(project_state, schema_editor, collect_sql)
        with connection.cursor() as cursor:
            cursor.execute(BOUND_SQL, {"ms": str(MIGRATION_LOCK_TIMEOUT_MS)})
            bound_ms = cursor.fetchone()[0]
        deferred = list(schema_editor.deferred_sql)
        pristine = project_state.clone()  # run() changes the state it is given: a try after a failed one starts anew
        for attempt in range(1, MIGRATION_LOCK_TRIES + 1):
            state = project_state if attempt == 1 else pristine.clone()
            try:
                with transaction.atomic(using=connection.alias):
                    state = run(state, schema_editor, collect_sql)
                    self._run_deferred(schema_editor, len(deferred))
                    return state
            except OperationalError as exc:
                if getattr(getattr(exc, "__cause__", None), "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                schema_editor.deferred_sql[:] = deferred
                if attempt == MIGRATION_LOCK_TRIES:
                    raise MigrationLockTimeout(self._gave_up(connection, bound_ms)) from exc
                sleep(MIGRATION_LOCK_BACKOFF * attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    @staticmethod
    def _run_deferred(schema_editor, start: int) -> None:
        """What the try deferred (an index, a foreign key) runs inside its savepoint, so a lock wait there is retried.

        The schema editor would run it at its exit, right after this migration (the executor opens one per
        migration), outside the savepoint; here it runs at the same point in the same order.
        """
        added = schema_editor.deferred_sql[start:]
        del schema_editor.deferred_sql[start:]
        for sql in added:
            schema_editor.execute(sql)

    def _unbounded(self, run, project_state, schema_editor):
        connection = schema_editor.connection
        with connection.cursor() as cursor:
            cursor.execute(UNBOUND_SQL)
            saved = cursor.fetchone()
        try:
            return run(project_state, schema_editor, False)
        finally:
            with connection.cursor() as cursor:
                cursor.execute(RESTORE_SQL, saved[:2])

    def _gave_up(self, connection, bound_ms: str) -> str:
        with connection.cursor() as cursor:
            cursor.execute(HOLDERS_SQL, [APP_TABLES_LIKE])
            holders = "; ".join(
                f"pid {pid} ({state}, in a transaction for {age}): {query}"
                for pid, state, age, query in cursor.fetchall()
            )
        return (
            f"migration {self.app_label}.{self.name} waited {bound_ms} for its locks {MIGRATION_LOCK_TRIES} times "
            f"and gave up; nothing of it was applied. Sessions holding locks on dispatch_app tables: "
            f"{holders or 'none any more'}. End them (or let them finish) and run migrate again."
        )
