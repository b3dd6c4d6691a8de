"""The worker runs only the project's work (rqworker.admission): forged jobs are refused, never imported.

Real PostgreSQL, real Redis, a real PipelineWorker in burst mode. Each forged job names a canary
(tests.canary.touch) somewhere RQ would import and call it; the canary file never appears, the forged
jobs end in RQ's failed registry, each refusal is counted where the dashboard reads it, and the real job
sent beside them runs once.
"""

from __future__ import annotations

import logging

import pytest
from rq import Callback, Queue, Repeat, Retry
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from dispatch_app import submit
from dispatch_app.models import Job
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.worker import PipelineWorker, admission
from dispatch_app.views import board
from tests.canary import CANARY_ENV
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.recovery_helpers import dispatch_now

pytestmark = pytest.mark.django_db(transaction=True)
CANARY = "tests.canary.touch"


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


@pytest.fixture
def canary(tmp_path, monkeypatch):
    path = tmp_path / "canary"
    monkeypatch.setenv(CANARY_ENV, str(path))
    admission._told.clear()
    yield path
    admission._told.clear()


def run_worker(redis_conn, *queues) -> PipelineWorker:
    rq_queues = [Queue(q, connection=redis_conn, serializer=JSONSerializer) for q in queues]
    worker = PipelineWorker(rq_queues, connection=redis_conn, name="admission")
    worker.work(burst=True)
    return worker


def forge(redis_conn, queue: str, func, *args, job_id=None, **options):
    return Queue(queue, connection=redis_conn, serializer=JSONSerializer).enqueue(func, *args, job_id=job_id, **options)


def test_forged_jobs_of_every_kind_run_nothing_and_the_real_job_runs_once(redis_conn, provider, canary, caplog):
    real = submit("delivery", PAYLOADS["delivery"])
    scheduled = submit("delivery", PAYLOADS["delivery"])  # a real job's id, for forgeries that name it
    dispatch_now()
    forged = {
        "os.system": forge(redis_conn, "delivery", "os.system", f"touch {canary}"),
        "canary": forge(redis_conn, "delivery", CANARY),
        "callback": forge(
            redis_conn,
            "delivery",
            "dispatch_app.run.delivery",
            scheduled.pk,
            7,
            job_id=rq_job_id(scheduled.pk, 7),
            on_success=Callback(CANARY),
            on_failure=Callback(CANARY),
        ),
        "kwargs": forge(redis_conn, "delivery", "dispatch_app.run.delivery", scheduled.pk, 1, job_id="x", foo=1),
        "bad id": forge(redis_conn, "delivery", "dispatch_app.run.delivery", scheduled.pk, 1, job_id="pf-0-1"),
        "leading zero id": forge(
            redis_conn, "delivery", "dispatch_app.run.delivery", scheduled.pk, 1, job_id=f"pf-0{scheduled.pk}-1"
        ),
        "bool args": forge(
            redis_conn, "delivery", "dispatch_app.run.delivery", True, 1, job_id=rq_job_id(scheduled.pk, 13)
        ),
        "other domain's entry": forge(
            redis_conn, "delivery", "dispatch_app.run.image_series", scheduled.pk, 8, job_id=rq_job_id(scheduled.pk, 8)
        ),
        "lane of another queue": forge(
            redis_conn,
            "image_series.recovery",
            "dispatch_app.run.delivery",
            scheduled.pk,
            9,
            job_id=rq_job_id(scheduled.pk, 9),
        ),
        "retries": forge(
            redis_conn,
            "delivery",
            "dispatch_app.run.delivery",
            scheduled.pk,
            10,
            job_id=rq_job_id(scheduled.pk, 10),
            retry=Retry(max=3),
        ),
        "repeats": forge(
            redis_conn,
            "delivery",
            "dispatch_app.run.delivery",
            scheduled.pk,
            11,
            job_id=rq_job_id(scheduled.pk, 11),
            repeat=Repeat(times=2),
        ),
        # Exactly the dispatcher's call, id and queue, but a hash it did not write: no signature (rq_ids).
        "unsigned": forge(
            redis_conn, "delivery", "dispatch_app.run.delivery", scheduled.pk, 14, job_id=rq_job_id(scheduled.pk, 14)
        ),
        "another deployment's id": forge(
            redis_conn,
            "delivery",
            "dispatch_app.run.delivery",
            scheduled.pk,
            15,
            job_id=rq_job_id(scheduled.pk, 15, ns="otherdeployment"),
        ),
        "dependency": forge(
            redis_conn,
            "delivery.recovery",
            "dispatch_app.run.delivery",
            scheduled.pk,
            12,
            job_id=rq_job_id(scheduled.pk, 12),
            depends_on=["pf-no-such"],
        ),
    }
    # Had RQ deferred it (its dependency unfinished), it would wait in the deferred registry: put it in the lane.
    if forged["dependency"].id.encode() not in redis_conn.lrange("rq:queue:delivery.recovery", 0, -1):
        redis_conn.rpush("rq:queue:delivery.recovery", forged["dependency"].id)
    unreadable = forge(redis_conn, "delivery", CANARY, job_id="garbage")
    redis_conn.hset(unreadable.key, mapping={"data": b"\x80\x04pickled", "timeout": b"not a number"})

    with caplog.at_level(logging.INFO, logger="dispatch_app.rqworker"):
        run_worker(redis_conn, "delivery", "delivery.recovery", "image_series.recovery")

    assert not canary.exists()
    assert Job.objects.get(pk=real.pk).status == "succeeded"
    failed = set(FailedJobRegistry("delivery", connection=redis_conn).get_job_ids())
    failed |= set(FailedJobRegistry("delivery.recovery", connection=redis_conn).get_job_ids())
    failed |= set(FailedJobRegistry("image_series.recovery", connection=redis_conn).get_job_ids())
    assert failed == {j.id for j in forged.values()} | {"garbage"}
    totals = admission.totals(redis_conn)
    assert totals["count"] == len(forged) + 1
    assert set(totals["kinds"]) == set(admission.KINDS)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.action == "job_refused"]
    assert sorted(r.kind for r in errors) == sorted(admission.KINDS)  # once per kind
    assert any("os.system" in r.getMessage() for r in errors)
    # The job PostgreSQL knows as "scheduled" was never started by any of them (attempts 7-12 are not its own).
    assert Job.objects.get(pk=scheduled.pk).status in ("queued", "succeeded")


def test_the_dashboard_shows_a_red_banner_naming_the_last_refused_function(redis_conn, canary):
    forge(redis_conn, "delivery", "os.system", "true")
    run_worker(redis_conn, "delivery")
    data = {"dispatchers": [], "rq": {"error": "", "workers": []}, "domains": {}, "paused": {}}
    data["refused"] = admission.totals(redis_conn)
    [banner] = [b for b in board.banners(data) if b["key"] == "refused-jobs"]
    assert banner["level"] == "error"
    assert banner["text"] == "1 jobs refused: not the project's work, last: os.system"


def test_the_refusals_are_a_metric_by_kind(redis_conn, canary):
    from dispatch_app.housekeeping.metrics import RefusedJobsCollector

    forge(redis_conn, "delivery", "os.system", "true")
    forge(redis_conn, "delivery", "dispatch_app.run.delivery", 1, 1, job_id="pf-1-2")
    run_worker(redis_conn, "delivery")
    [family] = RefusedJobsCollector().collect()
    counts = {s.labels["kind"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert counts[admission.NOT_AN_ENTRY_POINT] == 1 and counts[admission.BAD_ID] == 1
    assert sum(counts.values()) == 2
