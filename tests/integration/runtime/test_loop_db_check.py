"""A loop's PostgreSQL health check (SELECT 1): the dispatch loop's runner checks after an error or an idle
spell, not before every drain; other loops still check before every step. Real connections, real threads."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from dispatch_app.db.check import ConnectionCheck
from dispatch_app.runtime.runner import LoopRunner
from dispatch_app.runtime.supervisor import Supervisor
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)
SAFETY = 30


class Steps:
    """A loop that runs the given steps, one per wake, then stops the runner; each step sees whether the
    connection was just reset for a health check (Django's health_check_done is False until it runs)."""

    name = "steps"

    def __init__(self, steps, stop: threading.Event):
        self.steps = list(steps)
        self.stop = stop
        self.reset = []

    def wait(self) -> str:
        if not self.steps:
            self.stop.set()
        return "tick"

    def run_once(self, trigger):
        step = self.steps.pop(0)
        self.reset.append(connection.connection is None or not connection.health_check_done)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        step()


def run(steps, db_check) -> list[bool]:
    stop = threading.Event()
    loop = Steps(steps, stop)
    runner = LoopRunner(loop, stop, error_backoff=0.01, db_check=db_check)
    runner.start()
    assert runner.join(SAFETY)
    return loop.reset


def nothing():
    pass


def fails():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1/0")  # a database error: Django marks the connection errors_occurred


def test_back_to_back_steps_reuse_the_connection_without_a_check():
    assert run([nothing] * 4, ConnectionCheck(interval=3600)) == [True, False, False, False]


def test_a_step_after_an_idle_spell_or_an_error_checks_again():
    assert run([nothing, nothing], ConnectionCheck(interval=0)) == [True, True]
    assert run([nothing, fails, nothing, nothing], ConnectionCheck(interval=3600)) == [True, False, True, False]


def test_without_a_db_check_every_step_checks_as_before():
    assert run([nothing] * 3, None) == [True, True, True]


def test_the_supervisors_dispatch_loop_checks_by_interval_and_other_loops_every_step():
    conf = loop_settings(WORKER_DB_CHECK_INTERVAL=7.0)
    supervisor = Supervisor(conf, listen=False)
    (dispatch,) = [r for r in supervisor.runners if r.name == "dispatch"]
    assert isinstance(dispatch.db_check, ConnectionCheck) and dispatch.db_check.interval == 7.0
    other = supervisor.add_loop(Steps([], threading.Event()), domain="steps")
    assert other.db_check is None
    supervisor.dispatch.close()
