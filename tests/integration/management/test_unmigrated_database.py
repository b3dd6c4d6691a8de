"""The pipeline's commands refuse a database that is behind its migrations, naming the command to run."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.migrations.recorder import MigrationRecorder

from dispatch_app.management.commands._migrated import require_migrated, unapplied

pytestmark = [pytest.mark.django_db, pytest.mark.path_dependent]


def latest_dispatch_migration() -> str:
    return MigrationRecorder.Migration.objects.filter(app="dispatch_app").order_by("-applied", "-id").first().name


def forget(name: str) -> None:
    # As if migrate had not run it yet: the row goes, inside the test's transaction (rolled back after).
    MigrationRecorder.Migration.objects.filter(app="dispatch_app", name=name).delete()


def test_migrated_database_passes():
    assert unapplied() == []
    require_migrated()


def test_missing_migration_is_named_with_the_fix():
    name = latest_dispatch_migration()
    forget(name)
    assert unapplied() == [f"dispatch_app.{name}"]
    with pytest.raises(CommandError) as caught:
        require_migrated()
    assert f"dispatch_app.{name}" in str(caught.value)
    assert "manage.py migrate" in str(caught.value)


@pytest.mark.parametrize("command", [["recover", "--once"], ["runworkers"], ["demo"]])
def test_commands_refuse_before_starting_anything(command):
    forget(latest_dispatch_migration())
    with pytest.raises(CommandError, match="unapplied migration"):
        call_command(*command)


@pytest.mark.timeout(60)  # were the check gone, the dispatcher would run here until stopped
def test_rundispatcher_refuses_before_it_starts():
    forget(latest_dispatch_migration())
    with pytest.raises(CommandError, match="unapplied migration"):
        # The longest lease: the lease check (before the migration check) passes whatever Redis timeout is set.
        call_command("rundispatcher", "--no-recovery", "--lease", "86400")
