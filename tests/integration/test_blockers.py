"""Every wait names its blocker (issue 28.4): the job list's "waiting in" says behind what, the timeline too."""

from __future__ import annotations

import html
import re
import uuid

import pytest
from django.contrib.auth.models import User

from dispatch_app.models import DispatcherProcess
from dispatch_app.ops import actions
from tests.integration.opsdata import envelope, job, sql

JOBS = "/admin/dispatch_app/job/"
pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("op", password="pw"))
    return client


def waiting_cell(page: str, job_id: int) -> str:
    row = page.split(f"/job/{job_id}/timeline/")[0].rsplit("<tr", 1)[1]
    cell = re.search(r'<td class="field-waiting_in">(.*?)</td>', row, re.S).group(1)
    return html.unescape(re.sub(r"<[^>]+>", "", cell).strip())


def test_the_list_names_each_outbox_blocker(operator):
    DispatcherProcess.objects.create(name="h:1:live", hostname="h", pid=1)  # a live dispatcher
    paused = job("agent", "submitted")
    envelope(paused, "pending")
    actions.pause_domain("agent", reason="vendor down")
    retry = job("delivery", "submitted", attempt=3)
    envelope(retry, "pending", attempt=3, available_ago=-42)
    send_retry = job("delivery", "submitted")
    envelope(send_retry, "pending", available_ago=-20, send_attempts=2, last_error="ConnectionError: refused")
    scheduled = job("delivery", "submitted")
    envelope(scheduled, "pending", available_ago=-3600)
    leased = job("delivery", "submitted")
    env = envelope(leased, "pending", available_ago=-25)
    sql("UPDATE dispatch_app_dispatchenvelope SET lease_token = %s WHERE id = %s", [uuid.uuid4(), env.pk])
    dead = job("delivery", "submitted")
    envelope(dead, "dead", last_error="domain 'x' is not registered")
    due = job("delivery", "submitted")
    envelope(due, "pending")

    page = operator.get(JOBS).content.decode()
    assert waiting_cell(page, paused.pk).startswith("outbox: dispatch of its domain paused by system")
    assert "vendor down" in waiting_cell(page, paused.pk)
    assert re.match(
        r"(outbox|backoff): backoff before retry 2 \(attempt 3\): due in (42|41)\.\d s", waiting_cell(page, retry.pk)
    )
    assert re.match(
        r"outbox: send backoff after 2 failed send\(s\): due in \d+\.\d s; last error: Conn",
        waiting_cell(page, send_retry.pk),
    )
    assert waiting_cell(page, scheduled.pk).startswith(
        "outbox: scheduled: due in 60.0 min"
    ) or "59.9 min" in waiting_cell(page, scheduled.pk)
    assert re.match(
        r"outbox: being sent by a dispatcher \(its lease ends in \d+\.\d s\)", waiting_cell(page, leased.pk)
    )
    assert "envelope dead (domain 'x' is not registered)" in waiting_cell(page, dead.pk)
    assert "waiting for a dispatcher's claim" in waiting_cell(page, due.pk)

    DispatcherProcess.objects.all().delete()  # nobody to send it
    page = operator.get(JOBS).content.decode()
    assert "due, and no live dispatcher to send it" in waiting_cell(page, due.pk)
