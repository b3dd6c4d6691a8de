"""dispatch_app.timeline.stages defines stage times twice, in Python (one job's page) and in SQL (aggregates): both must
give the same number for every completed stage, including the awkward cases."""

from __future__ import annotations

import pytest
from django.db import connection

from dispatch_app.db.clock import db_now
from dispatch_app.models import JobAttempt
from dispatch_app.timeline import stage_sql, stages
from tests.integration.opsdata import attempt_row, job

pytestmark = pytest.mark.django_db

CASES = {
    # name: (instants in seconds ago, outcome)
    "plain": (dict(created_ago=100, dispatched_ago=99, started_ago=97, finished_ago=90), "succeeded"),
    "retry backoff": (dict(created_ago=100, due_ago=70, dispatched_ago=69, started_ago=60, finished_ago=50), "failed"),
    # An operator made it due now 40 s into a 60 s backoff: the backoff ends at the dispatch.
    "backoff cut short": (dict(created_ago=100, due_ago=40, dispatched_ago=60, started_ago=59), ""),
    # The worker started before the dispatcher's mark committed: RQ wait 0, not negative.
    "start before mark": (dict(created_ago=10, dispatched_ago=5, started_ago=5.002, finished_ago=4), "succeeded"),
    "superseded in RQ": (dict(created_ago=900, dispatched_ago=899, finished_ago=300), "superseded"),
    "superseded on a dead worker": (
        dict(created_ago=900, dispatched_ago=899, started_ago=898, finished_ago=1),
        "superseded",
    ),
    "cancelled in backoff": (dict(created_ago=100, due_ago=-100, finished_ago=50), "cancelled"),
}


def test_python_and_sql_agree_on_every_completed_stage():
    for name, (instants, outcome) in CASES.items():
        attempt_row(job("delivery", "succeeded"), 1, outcome=outcome, with_envelope=False, **instants)
    columns = ", ".join(f"{stage_sql.seconds_sql(s)} AS {s}" for s in stages.STAGES)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT a.id, {columns} FROM dispatch_app_jobattempt a ORDER BY a.id")
        in_sql = {row[0]: dict(zip(stages.STAGES, row[1:], strict=True)) for row in cursor.fetchall()}
    now = db_now()
    checked = 0
    for row, name in zip(JobAttempt.objects.order_by("id"), CASES, strict=True):
        attempt = stages.Attempt(
            attempt=1,
            created_at=row.created_at,
            due_at=row.due_at,
            dispatched_at=row.dispatched_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            outcome=row.outcome,
        )
        for stage in attempt.stages(now):
            sql_seconds = in_sql[row.id][stage.key]
            if stage.ongoing or stage.cut_short and stage.key != "worker" or stage.duration is None:
                assert sql_seconds is None, (name, stage.key)  # not completed: no number in the aggregates
                continue
            assert sql_seconds == pytest.approx(stage.duration.total_seconds(), abs=1e-6), (name, stage.key)
            checked += 1
    assert checked >= 15


def test_the_awkward_cases_read_as_an_operator_expects():
    now = db_now()
    rows = {}
    for name, (instants, outcome) in CASES.items():
        attempt_row(job("delivery", "succeeded"), 1, outcome=outcome, with_envelope=False, **instants)
    for row, name in zip(JobAttempt.objects.order_by("id"), CASES, strict=True):
        rows[name] = stages.Attempt(
            1, row.created_at, row.due_at, row.dispatched_at, row.started_at, row.finished_at, row.outcome
        )

    def seconds(name, key):
        stage = rows[name].stage(key, now)
        return None if stage.duration is None else round(stage.duration.total_seconds(), 3)

    assert [seconds("retry backoff", k) for k in stages.STAGES] == [30.0, 1.0, 9.0, 10.0]
    assert seconds("backoff cut short", "backoff") == 40.0 and seconds("backoff cut short", "outbox") == 0.0
    assert seconds("start before mark", "rq") == 0.0
    rq = rows["superseded in RQ"].stage("rq", now)
    assert rq.cut_short and rq.duration.total_seconds() == pytest.approx(599, abs=1e-3)
    assert rows["superseded in RQ"].stage("worker", now).duration is None
    worker = rows["superseded on a dead worker"].stage("worker", now)
    assert worker.cut_short and worker.duration.total_seconds() == pytest.approx(897, abs=1e-3)
    backoff = rows["cancelled in backoff"].stage("backoff", now)
    assert backoff.cut_short and backoff.duration.total_seconds() == pytest.approx(50, abs=1e-3)
    assert rows["cancelled in backoff"].waiting_in(now) == "finished"
