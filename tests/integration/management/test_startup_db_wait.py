"""A (re)started dispatcher or worker waits out a passing database failure at its start-up check.

Found by the mixed chaos scenario: a dispatcher restarted after a kill met a
terminated backend in its migration check and exited. Real connections to the
real server: one alias points at a port nothing listens on (refused, as while
PostgreSQL restarts), one at a database that does not exist.
"""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from dispatch_app.management.commands._migrated import require_migrated
from tests.helpers import extra_alias

PROBE = "startup_probe"


@pytest.fixture
def probe_alias(django_db_blocker):
    """A second alias on the server's own ``postgres`` database (always there, never migrated), with a
    connection of its own; each test breaks it its way. A check that gets through says "unapplied migrations".

    Not a django_db test: that would allow only the declared aliases, and this one exists for the test alone.
    """
    with django_db_blocker.unblock(), extra_alias(PROBE, NAME="postgres") as probe:
        yield probe.settings_dict


class FakeTime:
    """The check's clock and sleep: each sleep moves the clock; ``on_sleep`` can change the world meanwhile."""

    def __init__(self, on_sleep=None):
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))


def test_a_database_back_within_the_wait_is_checked(probe_alias):
    port = probe_alias["PORT"]
    probe_alias["PORT"] = 1  # nothing listens: refused, as while PostgreSQL restarts

    def back_after_two(count: int) -> None:
        if count == 2:
            probe_alias["PORT"] = port

    fake = FakeTime(back_after_two)
    with pytest.raises(CommandError, match="unapplied migration"):  # the check itself got through
        require_migrated(PROBE, wait=30, sleep=fake.sleep, clock=fake.clock)
    assert fake.sleeps == [0.1, 0.2], "two refusals waited out with backoff, then the check ran"


def test_a_database_that_stays_away_ends_the_start_naming_the_error(probe_alias):
    probe_alias["PORT"] = 1
    fake = FakeTime()
    with pytest.raises(CommandError, match=r"did not answer the start-up check for 3 s: .*(refused|connect)"):
        require_migrated(PROBE, wait=3, sleep=fake.sleep, clock=fake.clock)
    assert fake.now == pytest.approx(3.0), "waited exactly the bound"
    assert fake.sleeps[:5] == [0.1, 0.2, 0.4, 0.8, 1.5], "backoff doubling, the last step cut to the bound"


def test_a_database_that_does_not_exist_is_said_at_once(probe_alias):
    probe_alias["NAME"] = "pf_no_such_database"
    fake = FakeTime()
    with pytest.raises(CommandError, match='refused the start-up check: .*"pf_no_such_database" does not exist'):
        require_migrated(PROBE, wait=30, sleep=fake.sleep, clock=fake.clock)
    assert fake.sleeps == []


def test_the_deployments_identity_is_read_through_the_same_wait(probe_alias):
    """A worker restarted while PostgreSQL crashed passed the migration check, then died reading its deployment's
    identity (fault scenario 41 in CI): that read waits the database out the same way."""
    from django.db import connections

    from dispatch_app.management.commands._migrated import answered
    from dispatch_app.rq.deployment import IDENTITY_SQL

    port = probe_alias["PORT"]
    probe_alias["PORT"] = 1

    def back_after_one(count: int) -> None:
        probe_alias["PORT"] = port

    def identity():
        with connections[PROBE].cursor() as cursor:
            cursor.execute(IDENTITY_SQL)
            return cursor.fetchone()

    fake = FakeTime(back_after_one)
    system, database, _oid = answered(identity, PROBE, wait=30, sleep=fake.sleep, clock=fake.clock)
    assert database == "postgres" and system and fake.sleeps == [0.1]
