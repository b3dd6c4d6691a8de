"""Task jobs on a real RQ worker (the project's entry point, start compare-and-set and finish): results,
errors, context and signals, read back from PostgreSQL."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from dispatch_app.models import Job, JobAttempt
from dispatch_app.tasks import OutboxBackend
from dispatch_app.tasks.compat import TaskResultStatus, default_task_backend
from dispatch_app.tasks.errors import TaskCancelled
from tests.integration.recovery_helpers import dispatch_now, run_workers
from tests.tasks import sample

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]


def run_all(redis_conn):
    dispatch_now()
    run_workers(redis_conn)


def test_a_task_runs_once_and_its_return_value_is_stored_as_json(redis_conn, signals):
    result = sample.add.enqueue(2, b=3)
    run_all(redis_conn)

    job = Job.objects.get(pk=int(result.id))
    assert (job.status, job.attempt, job.result) == ("succeeded", 1, 5)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 5 and result.errors == []
    assert result.started_at == job.started_at and result.finished_at == job.finished_at
    (attempt,) = JobAttempt.objects.filter(job=job)
    assert result.worker_ids == [attempt.worker] and attempt.worker  # the RQ worker's name
    assert result.attempts == 1
    # As Django documents: enqueued (READY), started (RUNNING) in the worker, finished with the outcome.
    assert signals == [
        ("enqueued", OutboxBackend, TaskResultStatus.READY, result.id),
        ("started", OutboxBackend, TaskResultStatus.RUNNING, result.id),
        ("finished", OutboxBackend, TaskResultStatus.SUCCESSFUL, result.id),
    ]


def test_an_exception_becomes_a_task_error_with_class_path_and_traceback(redis_conn, signals):
    result = sample.explode.enqueue("kaboom")
    run_all(redis_conn)

    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError" and error.exception_class is ValueError
    assert "raise ValueError(message)" in error.traceback and "ValueError: kaboom" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value
    assert signals[-1] == ("finished", OutboxBackend, TaskResultStatus.FAILED, result.id)


def test_a_return_value_that_is_not_json_fails_the_task(redis_conn):
    result = sample.returns_no_json.enqueue()
    run_all(redis_conn)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "builtins.TypeError"


def test_the_context_carries_the_jobs_attempt_and_result_id(redis_conn):
    result = sample.report_attempt.enqueue(note="hi")
    run_all(redis_conn)
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "note": "hi"}


def test_an_async_task_runs_and_aget_result_reads_it(redis_conn):
    result = sample.async_double.enqueue(21)
    run_all(redis_conn)

    fetched = async_to_sync(default_task_backend.aget_result)(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value == 42
    fetched = async_to_sync(sample.async_double.aget_result)(result.id)
    assert fetched.return_value == 42


def test_a_second_delivery_of_the_same_attempt_does_not_run_the_task_again(redis_conn, signals):
    result = sample.add.enqueue(1, 1)
    run_all(redis_conn)
    from dispatch_app.tasks.run import entry

    assert entry.default(int(result.id), 1) == {"duplicate": True}
    assert [s[0] for s in signals] == ["enqueued", "started", "finished"]


@pytest.mark.parametrize(
    ("status", "error_class"),
    [("cancelled", TaskCancelled), ("outcome_unknown", "dispatch_app.tasks.errors.TaskOutcomeUnknown")],
)
def test_cancelled_and_outcome_unknown_are_failed_with_a_named_error(status, error_class):
    result = sample.add.enqueue(1, 1)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_app_job SET status = %s, error = 'operator said so', finished_at = clock_timestamp() "
            "WHERE id = %s",
            [status, int(result.id)],
        )
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    (error,) = result.errors
    expected = error_class if isinstance(error_class, str) else f"{error_class.__module__}.{error_class.__qualname__}"
    assert error.exception_class_path == expected and error.traceback == "operator said so"
    assert issubclass(error.exception_class, Exception)


def test_an_error_the_worker_retries_fails_a_task_on_a_queue_that_is_not_retry_safe(redis_conn):
    result = sample.vendor_refuses_once.enqueue()
    run_all(redis_conn)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert result.errors[0].exception_class_path == "dispatch_app.tasks.errors.ErrorNotRetried"
    assert "ProviderError: vendor said no" in result.errors[0].traceback


def test_on_a_retry_safe_queue_the_same_error_becomes_the_next_attempt(redis_conn, safe_queue):
    result = sample.vendor_refuses_once.using(queue_name="safe").enqueue()
    run_all(redis_conn)
    job = Job.objects.get(pk=int(result.id))
    assert (job.status, job.attempt) == ("submitted", 2)
    with connection.cursor() as cursor:  # the retry's backoff, skipped: due now on the database clock
        cursor.execute(
            "UPDATE dispatch_app_dispatchenvelope SET available_at = clock_timestamp() "
            "WHERE job_id = %s AND status = 'pending'",
            [job.pk],
        )
    run_all(redis_conn)
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 2, 2)
