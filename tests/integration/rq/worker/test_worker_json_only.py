"""Workers read no pickle (issue 56): PipelineWorker forces JSON; the app's ``rqworker`` refuses the project's queues.

``manage.py rqworker --worker-class dispatch_app.rqworker.PipelineWorker`` handed the worker RQ's default serializer
(pickle) and django-rq's queue objects; RQ's ``Job.restore`` then unpickled a job's ``meta`` before admission looked
at the job. Now the worker reads JSON whatever it is given, and the app's ``rqworker`` (``_rq_refusal``) refuses
every queue and lane of a declared domain, django-rq's ``"default"`` too, while a queue that is not the project's
goes to django-rq's own command unchanged. Real Redis and PostgreSQL, real workers in burst mode (the processes of
each command: ``tests/acceptance/faults/test_49_worker_commands.py``).
"""

from __future__ import annotations

import pickle
import re

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings
from rq import Queue
from rq.job import Job as RQJob
from rq.registry import FailedJobRegistry
from rq.serializers import DefaultSerializer, JSONSerializer

from dispatch_app.management.commands._rq_refusal import project_queues
from dispatch_app.rq.worker import PipelineWorker, admission
from tests.canary import CANARY_ENV

pytestmark = pytest.mark.django_db(transaction=True)


class _Plant:
    """Unpickling this creates the marker file: arbitrary code run by whoever deserialises it."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_given_pickle_it_reads_json_and_refuses_a_pickled_meta_job_unread(redis_conn, tmp_path, monkeypatch):
    canary, marker = tmp_path / "canary", tmp_path / "unpickled"
    monkeypatch.setenv(CANARY_ENV, str(canary))
    # What django-rq's rqworker passes: its serializer option (default pickle) and queue objects of its own.
    given = Queue("delivery", connection=redis_conn, serializer=DefaultSerializer)
    worker = PipelineWorker([given], connection=redis_conn, name="given-pickle", serializer=DefaultSerializer)
    assert worker.serializer is JSONSerializer
    assert {q.name: q.serializer for q in worker.queues} == {
        "delivery": JSONSerializer,
        "delivery.recovery": JSONSerializer,
    }
    assert given.serializer is DefaultSerializer  # the caller's object is left as it was

    forged = Queue("delivery", connection=redis_conn, serializer=JSONSerializer).enqueue(
        "tests.canary.touch", "forged", job_id="planted-meta"
    )
    redis_conn.hset(forged.key, "meta", pickle.dumps(_Plant(str(marker))))
    admission._told.clear()
    worker.work(burst=True)

    assert not marker.exists(), "the worker unpickled the planted meta"
    assert not canary.exists(), "the forged job ran"
    assert FailedJobRegistry("delivery", connection=redis_conn).get_job_ids() == ["planted-meta"]
    assert admission.totals(redis_conn)["count"] == 1
    # Control: RQ reading the same hash with its default serializer runs the plant.
    RQJob.fetch("planted-meta", connection=redis_conn)
    assert marker.exists(), "control failed: the plant is not an exploit, so the check above proves nothing"


def test_the_project_queues_are_every_lane_of_a_declared_domain_and_django_rqs_default():
    assert project_queues(["delivery", "delivery.recovery", "workflow.recovery"]) == [
        "delivery",
        "delivery.recovery",
        "workflow.recovery",
    ]
    assert project_queues([]) == ["default"]  # no queue named: django-rq serves "default", a task queue here
    assert project_queues(["elsewhere", "delivery.elsewhere", "recovery"]) == []


def test_rqworker_refuses_a_project_queue_and_hands_another_to_django_rq_unchanged(redis_conn, tmp_path, monkeypatch):
    canary = tmp_path / "canary"
    monkeypatch.setenv(CANARY_ENV, str(canary))
    args = ("--burst", "--worker-class", "rq.worker.SimpleWorker", "--serializer", "rq.serializers.JSONSerializer")
    for queue in ("delivery", "delivery.recovery"):
        Queue(queue, connection=redis_conn, serializer=JSONSerializer).enqueue("tests.canary.touch", queue)
        refusal = rf"refuses the project's queues \({re.escape(queue)}\).*'manage.py runworkers'"
        with pytest.raises(CommandError, match=refusal):
            call_command("rqworker", queue, *args)
    assert not canary.exists()

    queues = {**settings.RQ_QUEUES, "elsewhere": settings.RQ_QUEUES["default"]}
    Queue("elsewhere", connection=redis_conn, serializer=JSONSerializer).enqueue("tests.canary.touch", "elsewhere")
    with override_settings(RQ_QUEUES=queues):
        call_command("rqworker", "elsewhere", *args)
    assert canary.read_text().startswith("ran with ('elsewhere',)"), "django-rq's own worker ran the other queue"


def test_the_repositorys_plain_rqworker_reads_json_only_and_never_runs_in_production(redis_conn):
    # django-rq's own command for the benchmark's peer and a few fault scenarios (productflow/, not in the wheel).
    with pytest.raises(CommandError, match="reads JSON only .* not 'rq.serializers.DefaultSerializer'"):
        call_command("plain_rqworker", "delivery", "--burst", "--serializer", "rq.serializers.DefaultSerializer")
    with override_settings(PRODUCTION=True), pytest.raises(CommandError, match="PRODUCTFLOW_ENV=production"):
        call_command("plain_rqworker", "delivery", "--burst")
