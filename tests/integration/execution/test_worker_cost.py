"""What the task costs PostgreSQL per job: the start and the finish, nothing else; the error's shape."""

from __future__ import annotations

import dataclasses

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import dispatch_app.execution.attempt as worker_module
from dispatch_app import domains, submit
from dispatch_app.execution import ERROR_MAX_CHARS, execute, format_error
from dispatch_app.models import Job, JobStatus
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db(transaction=True)  # the worker runs in autocommit, as in a worker process


@pytest.fixture
def counted(monkeypatch):
    """How often a job opens a transaction or health-checks its connection (each is a round trip)."""
    calls = {"is_usable": 0, "set_autocommit": 0}
    for name in calls:
        real = getattr(connection, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(connection, name, counting)
    return calls


def test_back_to_back_jobs_cost_two_statements_each_and_no_health_check(counted, monkeypatch):
    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(3)]
    monkeypatch.setattr(worker_module, "_check", worker_module._ConnectionCheck(interval=3600))
    execute("delivery", jobs[0].pk, 1)  # the first job of a process checks its connection
    counted.update(is_usable=0, set_autocommit=0)

    with CaptureQueriesContext(connection) as queries:
        for job in jobs[1:]:
            assert execute("delivery", job.pk, 1) == {"succeeded": True}

    statements = [q["sql"].split()[0] for q in queries.captured_queries]
    # The start CAS (a WITH: it marks an envelope its writer sent, store.writer_lease) and the finish, per job.
    assert statements == ["WITH", "UPDATE"] * 2, statements
    assert counted == {"is_usable": 0, "set_autocommit": 0}, "no SELECT 1, no BEGIN/COMMIT"
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 3


def test_the_connection_is_checked_again_after_the_interval(counted, monkeypatch):
    first, second = (submit("delivery", PAYLOADS["delivery"]) for _ in range(2))
    check = worker_module._ConnectionCheck(interval=0)
    monkeypatch.setattr(worker_module, "_check", check)
    execute("delivery", first.pk, 1)
    counted.update(is_usable=0)
    execute("delivery", second.pk, 1)
    # close_old_connections() arms Django's health check: the next query runs SELECT 1 first.
    assert counted["is_usable"] == 1


class Boom(RuntimeError):
    pass


def test_a_crash_is_recorded_as_class_message_blank_line_traceback(monkeypatch):
    def crash(ctx):
        raise Boom("the disk is full")

    job = submit("delivery", PAYLOADS["delivery"])
    with domains.registry.replaced(dataclasses.replace(domains.get_domain("delivery"), work=crash)):
        assert execute("delivery", job.pk, 1) == {"failed": "the disk is full"}

    job.refresh_from_db()
    head, blank, trace = job.error.split("\n", 2)
    assert head == f"{__name__}.Boom: the disk is full"
    assert blank == ""
    assert trace.startswith("Traceback (most recent call last):") and "in crash" in trace
    assert job.status == JobStatus.FAILED


def test_a_long_error_keeps_its_first_line_and_the_end_of_the_traceback():
    def chain(n):
        try:
            if n:
                chain(n - 1)
            raise ValueError("root cause " + "x" * 200)
        except ValueError as exc:
            if n == 60:
                raise KeyError("on top") from exc
            raise ValueError(f"level {n} " + "y" * 200) from exc

    with pytest.raises(KeyError) as caught:
        chain(60)
    error = format_error(caught.value)
    assert len(error) <= ERROR_MAX_CHARS
    head, blank, trace = error.split("\n", 2)
    assert (head, blank) == ("builtins.KeyError: 'on top'", "")
    assert trace.startswith("...") and trace.rstrip().endswith("KeyError: 'on top'")


def test_a_huge_message_is_cut_to_the_bound():
    error = format_error(ValueError("z" * 20_000))
    assert len(error) == ERROR_MAX_CHARS and error.startswith("builtins.ValueError: zzz")
