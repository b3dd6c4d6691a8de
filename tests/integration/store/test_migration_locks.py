"""store.migration_locks: a migration of ours behind a long transaction gives way to writers, retries, and says who.

A real second session holds a lock on the envelope table the way a long report does (ACCESS SHARE); the probe
migration asks for ACCESS EXCLUSIVE, as ``DROP TRIGGER`` does, and creates a table, so a half-applied try would
show. The pause between tries is the test's: it checks that a writer gets through while the migration waits.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import DatabaseError, connection, migrations
from django.db.migrations.state import ProjectState

from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.store.triggers import migration_locks
from dispatch_app.store.triggers.migration_locks import BoundedMigration, MigrationLockTimeout
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ENVELOPES = "dispatch_app_dispatchenvelope"
PROBE = "dispatch_app_migration_probe"


def probe_migration(*sql: str) -> BoundedMigration:
    migration = BoundedMigration("9999_probe", "dispatch_app")
    migration.operations = [migrations.RunSQL(statement) for statement in sql]
    return migration


LOCKING = probe_migration(f"CREATE TABLE {PROBE} (id int)", f"LOCK TABLE {ENVELOPES} IN ACCESS EXCLUSIVE MODE")


def apply(migration: BoundedMigration) -> None:
    with connection.schema_editor(atomic=True) as editor:
        migration.apply(ProjectState(), editor)


def table_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return cursor.fetchone()[0]


def writer_gets_through() -> bool:
    """Another session updates an envelope row's table within 0.5 s (False: it queued behind a lock request)."""
    with psycopg.connect(**listener_conninfo(), autocommit=True) as conn:
        conn.execute("SET lock_timeout = 500")
        try:
            conn.execute(f"UPDATE {ENVELOPES} SET attempt = attempt WHERE false")
        except psycopg.errors.LockNotAvailable:
            return False
        return True


@pytest.fixture
def holder():
    conn = psycopg.connect(**listener_conninfo())
    conn.execute(f"LOCK TABLE {ENVELOPES} IN ACCESS SHARE MODE")  # a long report's read
    yield conn
    conn.close()


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(migration_locks, "MIGRATION_LOCK_TIMEOUT_MS", 200)
    monkeypatch.setattr(migration_locks, "MIGRATION_LOCK_TRIES", 3)
    pauses = []
    monkeypatch.setattr(migration_locks, "sleep", pauses.append)
    yield pauses
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {PROBE}")


def test_behind_a_long_transaction_it_gives_way_to_writers_then_names_the_holder(holder, quick, monkeypatch):
    through = []
    monkeypatch.setattr(
        migration_locks, "sleep", lambda seconds: (quick.append(seconds), through.append(writer_gets_through()))
    )
    with pytest.raises(MigrationLockTimeout) as raised:
        apply(LOCKING)
    assert through == [True, True], "between tries no lock request of the migration's stays queued"
    assert quick == [1.0, 2.0]
    message = str(raised.value)
    assert "dispatch_app.9999_probe waited 200ms for its locks 3 times" in message
    assert f"pid {holder.info.backend_pid} (idle in transaction, in a transaction for 0:00:0" in message
    assert not table_exists(PROBE), "nothing of the migration is left applied"


def test_it_goes_through_once_the_holder_ends(holder, quick, monkeypatch):
    monkeypatch.setattr(migration_locks, "sleep", lambda seconds: (quick.append(seconds), holder.commit()))
    apply(LOCKING)
    assert quick == [1.0]
    assert table_exists(PROBE)
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] != "200ms", "the bound is the migration transaction's own"


def test_what_the_migration_defers_to_its_end_is_retried_with_it(holder, quick, monkeypatch):
    def defer(apps, schema_editor):  # as CreateModel defers its indexes and foreign keys
        schema_editor.deferred_sql.append(f"CREATE TABLE {PROBE} (id int)")
        schema_editor.deferred_sql.append(f"LOCK TABLE {ENVELOPES} IN ACCESS EXCLUSIVE MODE")

    migration = BoundedMigration("9999_probe", "dispatch_app")
    migration.operations = [migrations.RunPython(defer)]
    monkeypatch.setattr(migration_locks, "sleep", lambda seconds: (quick.append(seconds), holder.commit()))
    with connection.schema_editor(atomic=True) as editor:
        migration.apply(ProjectState(), editor)
        assert editor.deferred_sql == [], "run once, inside the savepoint, not again at the editor's exit"
    assert quick == [1.0], "the deferred lock wait was retried"
    assert table_exists(PROBE)


def test_a_shorter_bound_of_the_session_is_kept(holder, quick):
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = 50")
    try:
        with pytest.raises(MigrationLockTimeout, match="waited 50ms for"):
            apply(LOCKING)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


def test_an_error_that_is_not_a_lock_wait_is_raised_at_once(quick):
    with pytest.raises(DatabaseError) as raised:
        apply(probe_migration(f"CREATE TABLE {PROBE} (id int)", "SELECT 1/0"))
    assert not isinstance(raised.value, MigrationLockTimeout)
    assert quick == []
    assert not table_exists(PROBE)


def test_a_concurrently_migration_waits_for_old_transactions_instead_of_failing_half_way(holder):
    """CREATE INDEX CONCURRENTLY waits for the holder's transaction; a 50 ms lock_timeout would leave it invalid."""
    migration = probe_migration(f"CREATE INDEX CONCURRENTLY {PROBE}_idx ON {ENVELOPES} (attempt)")
    migration.atomic = False
    holder.execute(f"UPDATE {ENVELOPES} SET attempt = attempt WHERE false")  # a write in progress: the build waits
    outcome = {}

    def migrate() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 50")
                cursor.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cursor.fetchone()[0]
            with connection.schema_editor(atomic=False) as editor:
                migration.apply(ProjectState(), editor)
            with connection.cursor() as cursor:
                cursor.execute("SHOW lock_timeout")
                outcome["after"] = cursor.fetchone()[0]
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=migrate)
    thread.start()
    try:
        wait_until(
            lambda: "pid" in outcome and waiting_for_a_lock(outcome["pid"]) or "error" in outcome,
            10,
            message="the index build to wait for the holder",
        )
        assert "error" not in outcome, outcome
        holder.commit()
        thread.join(10)
        assert not thread.is_alive() and "error" not in outcome, outcome
        assert outcome["after"] == "50ms", "the session's own bound is back afterwards"
        with connection.cursor() as cursor:
            cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [f"{PROBE}_idx"])
            assert cursor.fetchone() == (True,)
    finally:
        holder.rollback()
        thread.join(10)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX IF EXISTS {PROBE}_idx")


def waiting_for_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
        return bool(row and row[0])
