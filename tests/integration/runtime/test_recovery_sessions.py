"""The recovery child's database sessions: named, committing asynchronously, still bounded by our timeouts.

``recovery_sessions`` changes the options every later session of the process
opens with (the child calls it before its loops start); each recovery loop runs
on its own thread with its own session, so the check opens one on a new thread.
"""

from __future__ import annotations

import copy
import threading

import pytest
from django.db import connection, connections

from dispatch_app.runtime.recovery_child import APPLICATION_NAME, recovery_sessions

SHOW_SQL = (
    "SELECT current_setting('synchronous_commit'), current_setting('application_name'), "
    "current_setting('statement_timeout') <> '0'"
)


def settings_of_a_new_session() -> tuple:
    seen = []

    def read() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute(SHOW_SQL)
                seen.append(cursor.fetchone())
        finally:
            connection.close()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(30)
    assert seen, "the new session did not answer"
    return seen[0]


@pytest.fixture
def restored_options():
    settings_dict = connections.settings["default"]
    saved = copy.deepcopy(settings_dict.get("OPTIONS", {}))
    yield
    settings_dict["OPTIONS"] = saved
    connection.settings_dict["OPTIONS"] = saved
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_before_a_session_commits_synchronously_and_is_not_named_recovery(restored_options):
    sync, name, bounded = settings_of_a_new_session()
    assert (sync, bounded) == ("on", True)
    assert name != APPLICATION_NAME


@pytest.mark.django_db(transaction=True)
def test_recovery_sessions_are_named_and_commit_asynchronously_with_the_timeouts_kept(restored_options):
    recovery_sessions()
    assert settings_of_a_new_session() == ("off", APPLICATION_NAME, True)


@pytest.mark.django_db(transaction=True)
def test_with_async_commit_off_they_are_named_and_commit_synchronously(restored_options):
    recovery_sessions(async_commit=False)
    assert settings_of_a_new_session() == ("on", APPLICATION_NAME, True)
