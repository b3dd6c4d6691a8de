"""Every migration of dispatch_app bounds its lock waits (store.migration_locks), the next one included."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from dispatch_app.store.triggers.migration_locks import BoundedMigration

MIGRATIONS = sorted(
    path.stem for path in (Path(__file__).resolve().parents[2] / "dispatch_app" / "migrations").glob("[0-9]*.py")
)


def test_the_migrations_are_found():
    assert len(MIGRATIONS) >= 17 and MIGRATIONS[0] == "0001_initial"


@pytest.mark.parametrize("name", MIGRATIONS)
def test_each_migration_is_a_bounded_one(name):
    migration = importlib.import_module(f"dispatch_app.migrations.{name}").Migration
    assert issubclass(migration, BoundedMigration), (
        f"dispatch_app/migrations/{name}.py: subclass store.migration_locks.BoundedMigration, not migrations.Migration "
        "(a lock wait of a migration stops every submit behind it)"
    )
