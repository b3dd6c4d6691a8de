"""A task run interrupted (its worker died): recovery honours the queue's retry safety."""

from __future__ import annotations

import pytest

from dispatch_app.domains.providers import LocalProvider
from dispatch_app.models import Job, JobAttempt
from dispatch_app.recovery.round import Round
from dispatch_app.tasks.compat import TaskResultStatus
from dispatch_app.tasks.errors import TaskOutcomeUnknown
from tests.integration.recovery_helpers import (
    dispatch_now,
    mark_rq_started,
    policy,
    run_workers,
    start_like_a_worker,
)
from tests.tasks import sample

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]


def interrupted(result, redis_conn, tmp_path):
    """Dispatched, started by a worker that then died, and one recovery round of its domain."""
    dispatch_now()
    job = Job.objects.get(pk=int(result.id))
    start_like_a_worker(job)
    mark_rq_started(redis_conn, job.pk, 1, "worker-that-died")  # no such worker: its hash is gone
    Round(policy(job.domain), redis=redis_conn, provider=LocalProvider(root=tmp_path)).run_once()
    job.refresh_from_db()
    return job


def test_a_task_that_is_not_retry_safe_becomes_outcome_unknown_never_a_second_run(redis_conn, tmp_path):
    result = sample.add.enqueue(1, 2)
    job = interrupted(result, redis_conn, tmp_path)
    assert (job.status, job.attempt) == ("outcome_unknown", 1)

    dispatch_now()
    run_workers(redis_conn)
    assert Job.objects.get(pk=job.pk).status == "outcome_unknown"
    assert JobAttempt.objects.filter(job=job).count() == 1
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class is TaskOutcomeUnknown


def test_a_retry_safe_task_on_a_retry_safe_queue_runs_again_as_attempt_2(redis_conn, tmp_path, safe_queue):
    result = sample.safe_attempt.using(queue_name="safe").enqueue()
    job = interrupted(result, redis_conn, tmp_path)
    assert (job.status, job.attempt) == ("submitted", 2)
    assert sample.safe_attempt.get_result(result.id).status == TaskResultStatus.READY

    dispatch_now()
    run_workers(redis_conn)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2  # TaskContext.attempt inside the run: the job's attempt
    assert result.attempts == 2 and result.worker_ids[0] == "a-worker-that-then-dies"


def test_a_retry_safe_task_on_the_default_queue_is_not_run_again(redis_conn, tmp_path):
    result = sample.safe_attempt.enqueue()
    job = interrupted(result, redis_conn, tmp_path)
    assert (job.status, job.attempt) == ("outcome_unknown", 1)
