"""No admin page unpickles what Redis holds: django-rq's views are unmounted, the project's read Redis raw (issue 56).

Pickles that would create a marker file are planted where django-rq's views read Redis with RQ's default
serializer: the meta, the result field and the results stream of a job in every registry of a domain queue and of a
job waiting in it, and a worker hash naming such a job as its current one. As a superuser (every permission), every
URL django-rq mounted under ``/admin/django_rq/dashboard/`` (listed from ``django_rq.urls``) answers 404 to GET
and POST; every page of the project's admin that reads RQ renders, and ``dispatchstats`` prints; no marker exists.
A control mounts django-rq's views as a project could (``include("django_rq.urls")``): its "Empty failed registry"
and its worker page do create markers, so the plants are real. The system checks name such a URLconf
(``dispatch_app.E020``) and a ``django_rq`` listed before ``dispatch_app`` (``dispatch_app.E021``).
Real PostgreSQL and Redis.
"""

from __future__ import annotations

import pickle
import re
import types
from io import StringIO
from pathlib import Path

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import override_settings
from django.urls import include, path
from django_rq import views as rq_views
from django_rq.settings import get_queues_map
from django_rq.urls import get_admin_urlpatterns, get_api_urlpatterns
from rq import Queue, SimpleWorker
from rq.executions import Execution
from rq.job import Job as RQJob
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
)
from rq.results import Result
from rq.serializers import JSONSerializer

from dispatch_app.rq import checks as mounting_checks
from dispatch_app.rq.ids import rq_job_id
from tests.integration.opsdata import job

pytestmark = pytest.mark.version_dependent

QUEUE = "delivery"
RQ_ADMIN = "/admin/django_rq/dashboard/"
EVIL_WORKER = "pf-planted-worker"


class _Plant:
    """Unpickling this creates the marker file: arbitrary code run by whoever deserialises it."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant_job(conn, job_id: str, markers: Path, where: str) -> RQJob:
    """A job hash of the project's shape (JSON data) whose meta, result field and results stream are pickles."""
    rq_job = RQJob.create(
        "dispatch_app.run.delivery", args=(1, 1), id=job_id, connection=conn, serializer=JSONSerializer, origin=QUEUE
    )
    rq_job.save()
    conn.hset(rq_job.key, "meta", pickle.dumps(_Plant(str(markers / f"{where}-meta"))))
    conn.hset(rq_job.key, "result", pickle.dumps(_Plant(str(markers / f"{where}-result"))))
    as_pickle = RQJob(job_id, connection=conn)  # RQ's default serializer: the stream entry is a pickle too
    Result.create(as_pickle, Result.Type.SUCCESSFUL, 600, return_value=_Plant(str(markers / f"{where}-return")))
    return rq_job


def plant_everywhere(conn, markers: Path, running_id: int, queued_id: int) -> dict:
    """Plants in the queue, every registry and a worker hash; what the URLs need to name them."""
    q = Queue(QUEUE, connection=conn, serializer=JSONSerializer)
    registries = {
        "failed": FailedJobRegistry(queue=q),
        "finished": FinishedJobRegistry(queue=q),
        "scheduled": ScheduledJobRegistry(queue=q),
        "deferred": DeferredJobRegistry(queue=q),
        "canceled": CanceledJobRegistry(queue=q),
    }
    for where, registry in registries.items():
        plant_job(conn, f"planted-{where}", markers, where)
        conn.zadd(registry.key, {f"planted-{where}": 4_000_000_000})
    # The project's own jobs, as the pages look them up: one started on the planted worker, one waiting.
    started = plant_job(conn, rq_job_id(running_id, 1), markers, "started")
    conn.hset(started.key, mapping={"status": "started", "worker_name": EVIL_WORKER})
    with conn.pipeline() as pipe:  # its execution: the started registry and the worker's index name it
        Execution.create(started, ttl=600, pipeline=pipe, worker_name=EVIL_WORKER)
        pipe.execute()
    waiting = plant_job(conn, rq_job_id(queued_id, 1), markers, "queued")
    q.push_job_id(waiting.id)
    worker = SimpleWorker([q], connection=conn, name=EVIL_WORKER, serializer=JSONSerializer)
    worker.register_birth()
    conn.hset(worker.key, mapping={"state": "busy", "current_job": started.id, "hostname": "elsewhere"})
    result_id = conn.xrevrange(Result.get_key("planted-failed"), count=1)[0][0].decode()
    return {"job_id": "planted-failed", "result_id": result_id, "key": worker.key}


def concrete(route: str, values: dict[str, str]) -> str:
    """A URL for a route or regex of django_rq.urls, every parameter filled in."""
    route = re.sub(r"\(\?P<(\w+)>[^)]*\)\??", lambda m: values[m[1]], route)  # re_path groups (optional or not)
    route = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m[1]], route)
    return route.removeprefix("^").removesuffix("$").replace("/?", "/")


def rq_urls(values: dict[str, str]) -> list[str]:
    patterns = [*get_api_urlpatterns(), *get_admin_urlpatterns()]
    return sorted({RQ_ADMIN + concrete(str(p.pattern), values) for p in patterns})


@pytest.fixture
def superuser_client(client):
    client.force_login(User.objects.create_superuser("root", password="not-a-secret-pw-123"))
    return client


@pytest.fixture
def markers(tmp_path) -> Path:
    found = tmp_path / "markers"
    found.mkdir()
    return found


@pytest.mark.django_db
def test_no_page_once_mounted_by_django_rq_or_of_the_project_unpickles_a_plant(superuser_client, redis_conn, markers):
    from django_rq.models import Dashboard

    running = job(QUEUE, "running", dispatched_ago=60, started_ago=50)
    queued = job(QUEUE, "queued", dispatched_ago=30)
    planted = plant_everywhere(redis_conn, markers, running.pk, queued.pk)
    values = {"queue_index": str(get_queues_map()[QUEUE]), "scheduler_index": "0", "connection_index": "0"}
    values |= {"scheduler_name": "planted", "cron_job_name": "planted", "token": "planted", **planted}
    urls = rq_urls(values)
    assert len(urls) >= 25 and RQ_ADMIN + f"queues/{values['queue_index']}/failed/clear/" in urls

    assert not admin.site.is_registered(Dashboard)
    answered = {url: (superuser_client.get(url).status_code, superuser_client.post(url).status_code) for url in urls}
    assert answered == dict.fromkeys(urls, (404, 404))
    assert superuser_client.get("/admin/django_rq/").status_code == 404

    jobs, dashboard = "/admin/dispatch_app/job/", "/admin/dispatch_app/job/dashboard/"
    pages = [
        "/admin/",
        jobs,
        f"{jobs}?status__exact=running",
        f"{jobs}?status__exact=queued",
        f"{jobs}{running.pk}/timeline/",
        f"{jobs}{queued.pk}/timeline/",
        f"{jobs}{running.pk}/change/",
        dashboard,
        f"{dashboard}live/",
        f"{dashboard}data.json",
        "/admin/dispatch_app/dispatchenvelope/",
    ]
    shown = {page: superuser_client.get(page) for page in pages}
    assert {page: r.status_code for page, r in shown.items()} == dict.fromkeys(pages, 200)
    # The pages did read the plants (raw): the planted worker, busy with the running job, is on the dashboard.
    assert EVIL_WORKER in shown[f"{dashboard}data.json"].content.decode()
    out = StringIO()
    call_command("dispatchstats", stdout=out)
    assert EVIL_WORKER in out.getvalue()
    assert sorted(p.name for p in markers.iterdir()) == []


@pytest.mark.django_db
def test_the_plants_are_real_where_django_rq_reads_them_and_the_check_names_that_urlconf(
    superuser_client, redis_conn, markers
):
    running = job(QUEUE, "running", dispatched_ago=60, started_ago=50)
    queued = job(QUEUE, "queued", dispatched_ago=30)
    planted = plant_everywhere(redis_conn, markers, running.pk, queued.pk)
    index = get_queues_map()[QUEUE]
    mounted = urlconf(path("admin/", admin.site.urls), path("rq/", include("django_rq.urls")))
    # django-rq's worker page then fails on the JSON data it reads with pickle too: a 500, after the meta ran.
    superuser_client.raise_request_exception = False
    with override_settings(ROOT_URLCONF=mounted):
        [error] = mounting_checks.check_rq_views_unmounted()
        superuser_client.post(f"/rq/queues/{index}/failed/clear/")
        superuser_client.get(f"/rq/workers/{index}/{planted['key']}/")
    assert error.id == "dispatch_app.E020" and "at 'rq/'" in error.msg and "pickle" in error.msg
    # "Empty failed registry" unpickled the failed job's meta and result; the worker page its current job's meta.
    assert {"failed-meta", "failed-result", "started-meta"} <= {p.name for p in markers.iterdir()}


def urlconf(*patterns) -> types.ModuleType:
    module = types.ModuleType("planted_urlconf")
    module.urlpatterns = list(patterns)
    return module


def test_the_project_urlconf_mounts_no_django_rq_view_and_a_dashboard_registered_again_is_named():
    from django_rq.admin import QueueAdmin
    from django_rq.models import Dashboard

    assert mounting_checks.check_rq_views_unmounted() == []
    site = admin.AdminSite(name="another_admin")
    site.register(Dashboard, QueueAdmin)
    with override_settings(ROOT_URLCONF=urlconf(path("ops/", site.urls))):
        [error] = mounting_checks.check_rq_views_unmounted()
    assert error.id == "dispatch_app.E020"
    assert "at 'ops/django_rq/dashboard/'" in error.msg and "'ops/django_rq/dashboard/'" in error.msg
    one_view = urlconf(path("x/", include([path("failed/", rq_views.failed_jobs)])))
    with override_settings(ROOT_URLCONF=one_view):
        [error] = mounting_checks.check_rq_views_unmounted()
    assert "1 django-rq view(s) at 'x/': 'x/failed/'" in error.msg


def test_django_rq_listed_before_dispatch_app_fails_the_checks_saying_why(settings):
    assert mounting_checks.check_app_order() == []
    apps = list(settings.INSTALLED_APPS)
    assert apps.index("dispatch_app") < apps.index("django_rq")
    apps.remove("django_rq")
    apps.insert(apps.index("dispatch_app"), "django_rq")
    with override_settings(INSTALLED_APPS=apps):
        [error] = mounting_checks.check_app_order()
    assert error.id == "dispatch_app.E021"
    assert "'django_rq' is listed before 'dispatch_app'" in error.msg and "rqworker" in error.msg
    assert "runworkers" in error.hint
