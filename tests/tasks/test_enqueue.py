"""OutboxBackend.enqueue: the job and its envelope in the caller's transaction, nothing in Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction

from dispatch_app import submit
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.tasks import OutboxBackend
from dispatch_app.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task,
    task_backends,
)
from tests.factories import PAYLOADS
from tests.tasks import sample

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def test_the_project_default_backend_is_the_outbox_with_its_flags():
    backend = task_backends["default"]
    assert isinstance(backend, OutboxBackend)
    assert backend.supports_defer and backend.supports_get_result and backend.supports_async_task
    # The claim orders envelopes by (available_at, id): a priority would order nothing, so none is accepted.
    assert not backend.supports_priority


def test_enqueue_writes_job_and_envelope_and_returns_a_ready_result(redis_conn, signals):
    result = sample.add.enqueue(2, b=3)

    assert result.status == TaskResultStatus.READY and not result.is_finished
    job = Job.objects.get(pk=int(result.id))
    assert (job.domain, job.status, job.attempt) == ("default", "submitted", 1)
    assert job.payload == {"task": "tests.tasks.sample.add", "args": [2], "kwargs": {"b": 3}, "backend": "default"}
    envelope = DispatchEnvelope.objects.get(job=job)
    assert (envelope.queue, envelope.status, envelope.attempt) == ("default", "pending", 1)
    assert result.enqueued_at == job.submitted_at and result.args == [2] and result.kwargs == {"b": 3}
    assert signals == [("enqueued", OutboxBackend, TaskResultStatus.READY, result.id)]
    assert redis_conn.dbsize() == 0, "enqueue talks to PostgreSQL only"

    # The id is stable: any process reads the same job back.
    again = sample.add.get_result(result.id)
    assert (again.id, again.status, again.args, again.kwargs) == (result.id, TaskResultStatus.READY, [2], {"b": 3})
    assert again.task.func is sample.add.func and again.attempts == 0


def test_a_rollback_removes_the_enqueued_task_and_its_envelope(redis_conn):
    kept = sample.add.enqueue(1, 1)

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        doomed = sample.add.enqueue(40, 2)
        assert Job.objects.filter(pk=int(doomed.id)).exists()  # visible inside the caller's transaction
        raise Abort

    assert not Job.objects.filter(pk=int(doomed.id)).exists()
    assert not DispatchEnvelope.objects.filter(job_id=int(doomed.id)).exists()
    assert list(Job.objects.values_list("pk", flat=True)) == [int(kept.id)]
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(doomed.id)
    assert redis_conn.dbsize() == 0


def test_run_after_is_the_envelopes_available_at():
    later = db_now() + timedelta(hours=1)
    result = sample.add.using(run_after=later).enqueue(1, 2)

    envelope = DispatchEnvelope.objects.get(job_id=int(result.id))
    assert envelope.available_at == later
    # Not claimable until then, by the database clock the claim compares it with.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM dispatch_app_dispatchenvelope "
            "WHERE job_id = %s AND available_at <= clock_timestamp()",
            [int(result.id)],
        )
        assert cursor.fetchone()[0] == 0


def test_invalid_tasks_are_refused_before_anything_is_written():
    with pytest.raises(InvalidTask, match="priority"):
        sample.add.using(priority=10)
    with pytest.raises(InvalidTask, match="Queue 'elsewhere'"):
        sample.add.using(queue_name="elsewhere")
    with pytest.raises(TypeError, match="Unsupported type"):
        sample.add.enqueue(object(), 1)
    assert not Job.objects.exists()


def test_a_task_that_is_not_retry_safe_is_refused_on_a_retry_safe_queue(safe_queue):
    with pytest.raises(InvalidTask, match=r"not declared retry-safe.*queue 'safe'"):
        sample.add.using(queue_name="safe")
    # Declared retry-safe: accepted there, and on the queue that is not (it is just never re-run there).
    assert sample.safe_attempt.using(queue_name="safe").enqueue().status == TaskResultStatus.READY
    assert sample.safe_attempt.enqueue().status == TaskResultStatus.READY

    with pytest.raises(TypeError, match="under @task"):
        from dispatch_app.tasks import retry_safe

        retry_safe(sample.add)


def test_each_queue_is_a_domain_with_its_own_policy(safe_queue):
    from dispatch_app.domains import get_domain

    safe, default = get_domain("safe"), get_domain("default")
    assert (safe.recovery.retry_safe, safe.recovery.max_attempts) == (True, 4)
    assert (default.recovery.retry_safe, default.recovery.max_attempts) == (False, 3)
    assert safe.task_path == "dispatch_app.tasks.run.entry.safe"
    job = Job.objects.get(pk=int(sample.safe_attempt.using(queue_name="safe").enqueue().id))
    assert job.domain == "safe"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"QUEUES": {"default": {"RETRY_SAFE": "yes"}}},
            r"\['QUEUES'\]\['default'\]\['RETRY_SAFE'\] must be True or False",
        ),
        ({"QUEUES": {"default": {"RETRIES": 2}}}, "unknown key.*RETRIES"),
        ({"QUEUES": {"other": {}}}, "names 'other', not in"),
        ({"PRIORITY": 1}, "accepts only 'QUEUES'"),
        ({"QUEUES": {"default": {"MAX_ATTEMPTS": 0}}}, "MAX_ATTEMPTS.*must be >= 1"),
    ],
)
def test_bad_options_name_the_key(options, message):
    params = {"BACKEND": "dispatch_app.tasks.OutboxBackend", "QUEUES": ["default"], "OPTIONS": options}
    with pytest.raises(ImproperlyConfigured, match=message):
        OutboxBackend("default", params)


def test_a_task_defined_at_runtime_is_refused():
    def local(x):
        return x

    with pytest.raises(InvalidTask, match="module level"):
        task()(local)


def test_get_result_of_what_is_no_task_of_this_backend():
    job = submit("delivery", PAYLOADS["delivery"])
    with pytest.raises(TaskResultDoesNotExist, match="not a task"):
        default_task_backend.get_result(str(job.pk))
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("999999999")
    with pytest.raises(TaskResultDoesNotExist, match="whole numbers"):
        default_task_backend.get_result("abc")
