"""What a vendor call costs PostgreSQL: one commit per call, its outcome riding with the next write."""

from __future__ import annotations

import dataclasses
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dispatch_app import domains, submit
from dispatch_app.execution import execute
from dispatch_app.models import Job, JobStatus

pytestmark = pytest.mark.django_db(transaction=True)  # the worker runs in autocommit, as in a worker process

STEPS = ["fetch", "resize", "tag"]


def calls(job_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, status, result, finished_at IS NOT NULL FROM dispatch_app_vendorcall "
            "WHERE job_id = %s ORDER BY seq",
            [job_id],
        )
        return cursor.fetchall()


def test_three_calls_cost_three_records_and_a_finish_that_settles_the_last():
    job = submit("workflow", {"workflow_id": "wf-cost", "steps": STEPS})
    with CaptureQueriesContext(connection) as queries:
        assert execute("workflow", job.pk, 1) == {"succeeded": True}

    kinds = []
    for q in queries.captured_queries:
        sql = " ".join(q["sql"].split())
        if "INSERT INTO dispatch_app_vendorcall" in sql:
            kinds.append("record+settle" if sql.startswith("WITH settled AS") else "record")
        elif sql.startswith("WITH settled AS") and "UPDATE dispatch_app_job" in sql:
            kinds.append("settle+finish")
        elif sql.startswith("UPDATE dispatch_app_vendorcall"):
            kinds.append("settle")
        else:
            kinds.append(sql.split()[0])
    # The start, each call's record (carrying the previous call's outcome), the finish carrying the last outcome:
    # 5 statements where a record and a settle per call, and the finish, took 8. The start is a WITH (it marks an
    # envelope its writer sent, store.writer_lease).
    assert kinds == ["WITH", "record", "record+settle", "record+settle", "settle+finish"], kinds
    assert [(seq, status, done) for seq, status, _, done in calls(job.pk)] == [
        (0, "succeeded", True),
        (1, "succeeded", True),
        (2, "succeeded", True),
    ]
    assert [json.loads(result)["step"] for _, _, result, _ in calls(job.pk)] == STEPS  # raw cursor: jsonb text
    assert Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED


class Boom(RuntimeError):
    pass


def test_an_outcome_still_riding_is_written_when_the_work_breaks():
    workflow = domains.get_domain("workflow")

    def one_call_then_crash(ctx):
        workflow.work(ctx)  # its one step
        raise Boom("after the call")

    job = submit("workflow", {"workflow_id": "wf-crash", "steps": ["fetch"]})
    with domains.registry.replaced(dataclasses.replace(workflow, work=one_call_then_crash)):
        assert execute("workflow", job.pk, 1) == {"failed": "after the call"}
    # The call took effect before the crash: it reads succeeded, not pending (in doubt).
    assert [(seq, status) for seq, status, _, _ in calls(job.pk)] == [(0, "succeeded")]


def test_the_last_outcome_is_written_by_a_finish_that_finds_the_job_moved_on():
    workflow = domains.get_domain("workflow")

    def call_then_lose_the_job(ctx):
        result = workflow.work(ctx)  # its one step, whose outcome rides with the finish
        Job.objects.filter(pk=ctx.job_id).update(status=JobStatus.CANCELLED)  # an operator, meanwhile
        return result

    job = submit("workflow", {"workflow_id": "wf-late", "steps": ["fetch"]})
    with domains.registry.replaced(dataclasses.replace(workflow, work=call_then_lose_the_job)):
        assert execute("workflow", job.pk, 1) == {"succeeded": True}
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED  # the finish found it moved on
    # The call took effect all the same: a later attempt must find it succeeded, not in doubt.
    assert [(seq, status, done) for seq, status, _, done in calls(job.pk)] == [(0, "succeeded", True)]
