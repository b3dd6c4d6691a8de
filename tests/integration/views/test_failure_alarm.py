"""A domain whose vendor fails every call is a red banner naming the domain, the rate and its top errors (each
linking to those jobs), with a Pause button; the job list shows each job's error; the worker table counts the
business failures RQ calls successes (issue 28.2)."""

from __future__ import annotations

import html
import re
from urllib.parse import unquote_plus

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from dispatch_app.views import board
from tests.integration.opsdata import job, sql

JOBS = "/admin/dispatch_app/job/"
LIVE = "/admin/dispatch_app/job/dashboard/live/"
VENDOR_DOWN = "dispatch_app.domains.providers.ProviderError: delivery target 503 Service Unavailable"
pytestmark = [pytest.mark.django_db, pytest.mark.version_dependent]


def ended(domain: str, status: str, *, ago: float = 30, error: str = "", worker: str = ""):
    """A job that ran (on ``worker``) and ended ``ago`` seconds before the database clock's now."""
    j = job(domain, "running", started_ago=ago + 2)
    sql(
        "UPDATE dispatch_app_job SET status = %s, error = %s, "
        "finished_at = clock_timestamp() - make_interval(secs => %s) WHERE id = %s",
        [status, error, ago, j.pk],
    )
    if worker:  # the attempt's start recorded it (the history trigger owns the row; set it as the start would)
        sql("UPDATE dispatch_app_jobattempt SET worker = %s WHERE job_id = %s", [worker, j.pk])
    return j


def alarm_banners(data) -> list[dict]:
    return [b for b in data["banners"] if b["key"] == "failure-rate"]


def test_a_domain_failing_every_job_is_a_red_banner_with_its_top_errors(client, redis_conn):
    failing = [ended("delivery", "failed", error=f"{VENDOR_DOWN}\n\nTraceback ...{i}") for i in range(6)]
    ended("delivery", "failed", error="dispatch_app.domains.providers.ProviderError: bad address\n\nTraceback")
    ended("delivery", "succeeded")
    for _ in range(6):  # another domain, healthy
        ended("agent", "succeeded")
    ended("agent", "failed", error="x")

    data = board.build(redis_conn=redis_conn)
    (banner,) = alarm_banners(data)
    assert banner["level"] == "error" and banner["domain"] == "delivery"
    assert banner["text"].startswith("delivery: 88% of its jobs failed in the last 5 min (7 of 8 ended")
    assert [(e["message"], e["count"]) for e in banner["errors"]] == [
        (VENDOR_DOWN, 6),
        ("dispatch_app.domains.providers.ProviderError: bad address", 1),
    ]
    assert data["banners"][0]["key"] in ("no-dispatcher", "failure-rate")  # red ones before amber ones

    client.force_login(User.objects.create_superuser("op", password="pw"))
    page = client.get(LIVE).content.decode()
    assert 'data-key="failure-rate"' in page and 'id="pf-banner-pause-delivery"' in page
    assert "No alarms" not in page
    # The top error's link opens exactly the jobs that failed with it.
    link = html.unescape(page.split(f'<code>{html.escape(VENDOR_DOWN)}</code> <a href="')[1].split('"')[0])
    assert "error=" in link and VENDOR_DOWN in unquote_plus(link)
    listing = client.get(link).content.decode()
    shown = {int(pk) for pk in re.findall(r'name="_selected_action" value="(\d+)"', listing)}
    assert shown == {j.pk for j in failing}
    assert "503 Service Unavailable" in listing  # the error column

    # The banner's Pause button opens the confirmation, with the alarm as the proposed reason.
    confirm = client.post(
        "/admin/dispatch_app/job/dashboard/pause/", {"domain": "delivery", "op": "pause", "reason": banner["text"]}
    )
    assert 'id="pf-confirm-pause"' in confirm.content.decode() and "88% of its jobs failed" in confirm.content.decode()


def test_no_alarm_under_the_threshold_or_the_minimum_and_the_setting_moves_it(redis_conn):
    for _ in range(3):
        ended("delivery", "failed", error="boom")
    ended("delivery", "succeeded")
    assert alarm_banners(board.build(redis_conn=redis_conn)) == []  # 4 ended < FAILURE_ALARM_MIN_ENDED (5)
    ended("delivery", "succeeded")
    ended("delivery", "succeeded", ago=400)  # outside the 5 min window
    with override_settings(DISPATCH={"FAILURE_ALARM_RATE": 0.7}):
        assert alarm_banners(board.build(redis_conn=redis_conn)) == []  # 3/5 = 60% < 70%
    with override_settings(DISPATCH={"FAILURE_ALARM_RATE": 0.6}):
        (banner,) = alarm_banners(board.build(redis_conn=redis_conn))
        assert "60%" in banner["text"] and "3 of 5" in banner["text"]
    with override_settings(DISPATCH={"FAILURE_ALARM_RATE": 0.5, "FAILURE_ALARM_WINDOW": 600}):
        (banner,) = alarm_banners(board.build(redis_conn=redis_conn))
        assert "3 of 6" in banner["text"] and "last 10 min" in banner["text"]


def test_the_worker_table_counts_business_failures(client, redis_conn):
    w = SimpleWorker(
        [Queue("delivery", connection=redis_conn, serializer=JSONSerializer)],
        connection=redis_conn,
        name="w-vendor",
        serializer=JSONSerializer,
    )
    w.register_birth()
    for _ in range(4):
        ended("delivery", "failed", error=VENDOR_DOWN, worker="w-vendor")
    ended("delivery", "succeeded", worker="w-vendor")
    data = board.build(redis_conn=redis_conn)
    (info,) = [x for x in data["rq"]["workers"] if x["name"] == "w-vendor"]
    assert info["jobs_1h"] == {"succeeded": 1, "failed": 4}
    assert (info["successful"], info["failed"]) == (0, 0)  # what RQ says: nothing failed
    client.force_login(User.objects.create_superuser("op", password="pw"))
    page = client.get(LIVE).content.decode()  # the page reads the same test Redis (RQ_QUEUES)
    cell = page.split('class="num pf-worker-outcomes pf-red"')[1].split("</td>")[0]
    assert ">1 / 4</a>" in cell and "worker=w-vendor" in cell
    w.register_death()


def test_dispatchstats_prints_the_failure_alarm_with_its_top_errors(redis_conn):
    from io import StringIO

    from django.core.management import call_command

    for _ in range(5):
        ended("agent", "failed", error=f"{VENDOR_DOWN}\n\nTraceback")
    out = StringIO()
    call_command("dispatchstats", stdout=out)
    text = out.getvalue()
    assert "ERROR: agent: 100% of its jobs failed in the last 5 min (5 of 5" in text
    assert f"    5 × {VENDOR_DOWN}" in text
