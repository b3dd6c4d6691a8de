"""A session of our long-running commands is bounded even when the project's settings bound nothing.

Real sessions on the real server, read back with SHOW: an alias on the test database whose settings name no
bound (as the README's DATABASES block for an installed project), one that names some (kept, even 0), one whose
database sets one server-side (kept), and the commands' own wiring on the default connection.
"""

from __future__ import annotations

import io

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DEFAULT_DB_ALIAS, connection, connections

from dispatch_app.config.tuning import SESSION_BOUNDS_MS
from dispatch_app.db.session_bounds import bound_sessions, unbound_sessions
from dispatch_app.dispatch.listener import listener_conninfo
from tests.helpers import extra_alias

PROBE = "bounds_probe"
NAMES = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
FILLED = {"statement_timeout": "30s", "lock_timeout": "5s", "idle_in_transaction_session_timeout": "1min"}


@pytest.fixture(autouse=True)
def _unbind():
    yield
    unbound_sessions()


@pytest.fixture
def probe(django_db_blocker):
    """A second alias on the test database with no bound in its settings (no ``options``, no connect timeout)."""
    unbounded = {
        k: v
        for k, v in connections.settings[DEFAULT_DB_ALIAS].get("OPTIONS", {}).items()
        if k not in ("options", "connect_timeout")
    }
    with django_db_blocker.unblock(), extra_alias(PROBE, options=unbounded) as probe:
        yield probe


def shown(conn) -> dict[str, str]:
    with conn.cursor() as cursor:
        return {name: cursor.execute(f"SHOW {name}").fetchone()[0] for name in NAMES}


def test_unbounded_settings_get_every_bound(probe):
    assert shown(probe) == dict.fromkeys(NAMES, "0"), "the probe starts unbounded, as an installed project's sessions"
    probe.close()
    assert bound_sessions(PROBE) == SESSION_BOUNDS_MS
    assert probe.settings_dict["OPTIONS"]["connect_timeout"] == 10
    assert shown(probe) == FILLED


def test_the_session_open_at_the_call_is_bounded_too(probe):
    pid = probe.cursor().execute("SELECT pg_backend_pid()").fetchone()[0]
    bound_sessions(PROBE)
    assert probe.cursor().execute("SELECT pg_backend_pid()").fetchone()[0] == pid, "the same session"
    assert shown(probe)["lock_timeout"] == "5s"


def test_a_bound_the_settings_name_is_kept_even_zero(probe):
    probe.settings_dict["OPTIONS"].update(options="-c lock_timeout=1234 -c statement_timeout=0", connect_timeout=3)
    probe.close()
    assert bound_sessions(PROBE) == {"idle_in_transaction_session_timeout": 60000}
    assert probe.settings_dict["OPTIONS"]["connect_timeout"] == 3
    assert shown(probe) == {
        "statement_timeout": "0",
        "lock_timeout": "1234ms",
        "idle_in_transaction_session_timeout": "1min",
    }


def test_a_bound_the_server_sets_is_kept(probe):
    name = probe.settings_dict["NAME"]
    with psycopg.connect(**listener_conninfo(), autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE \"{name}\" SET idle_in_transaction_session_timeout = '42s'")
        try:
            probe.close()
            bound_sessions(PROBE)
            assert shown(probe) == {**FILLED, "idle_in_transaction_session_timeout": "42s"}
        finally:
            admin.execute(f'ALTER DATABASE "{name}" RESET idle_in_transaction_session_timeout')


def test_other_aliases_are_left_alone(probe):
    bound_sessions(PROBE)
    with extra_alias("bounds_other", options=dict(probe.settings_dict["OPTIONS"])) as other:
        assert shown(other)["statement_timeout"] == "0"


@pytest.mark.django_db
def test_recover_bounds_its_session_before_its_first_statement(monkeypatch):
    options = connection.settings_dict["OPTIONS"]
    monkeypatch.setitem(options, "options", "")  # names no bound
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 0")  # as a project that bounds nothing
    call_command("recover", "--once", "--dry-run", "--domain", "delivery", stdout=io.StringIO())
    assert shown(connection)["statement_timeout"] == "30s"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "command",
    [
        ("rundispatcher", "--no-dispatch", "--no-recovery"),  # refused after the bounds (nothing to run)
        ("runworkers", "--queues", "delivery", "--burst", "--processes", "1"),  # an empty queue: drained at once
    ],
)
def test_the_dispatcher_and_the_workers_bound_their_sessions(command, monkeypatch, redis_conn):
    options = connection.settings_dict["OPTIONS"]
    monkeypatch.setitem(options, "options", "")
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = 0")
    try:
        call_command(*command, stdout=io.StringIO())
    except CommandError as exc:
        assert "leaves nothing to run" in str(exc)
    assert shown(connection)["lock_timeout"] == "5s"
