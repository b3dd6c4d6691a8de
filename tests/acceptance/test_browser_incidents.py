"""The six incidents an operator is paged for, in headless Chromium (issue 28.6): each page names the blocker,
none is a 500, and each step saves a screenshot. Staged with rows and Redis keys written directly (the processes
behind them are the other browser test's and the fault scenarios' part), so every wait here is bounded and short.

Also: the dashboard, the job list and a timeline fit 1280 and 1920 px wide windows without a horizontal scroll.
"""

from __future__ import annotations

import os
import re
import socket

import pytest
from django.conf import settings
from django.test import override_settings

from dispatch_app.rq.ids import rq_job_id
from tests.acceptance.test_browser import CHROMIUM, DRIVER, _login, browser  # noqa: F401 - the fixture
from tests.helpers import ROOT

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists() or not os.path.exists(DRIVER),
        reason="no /usr/bin/chromium + chromedriver: apt-get install -y chromium chromium-driver",
    ),
    pytest.mark.version_dependent,
]

JOBS = "/admin/dispatch_app/job/"
DASHBOARD = JOBS + "dashboard/"


def shot(driver, tmp_path, name: str) -> None:
    out_dir = ROOT / "docs" / "img" / "incidents" if os.environ.get("PRODUCTFLOW_SCREENSHOTS") else tmp_path
    out_dir.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(out_dir / f"{name}.png"))


def status_of(driver, path: str) -> int:
    """The HTTP status of a same-origin GET from the page (the live fragment's fetch), bounded by the driver."""
    driver.set_script_timeout(20)
    return driver.execute_async_script(
        "var done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {credentials: 'same-origin'}).then(r => done(r.status)).catch(e => done(-1));",
        path,
    )


def no_error_page(driver, live_server, path: str) -> str:
    driver.get(live_server.url + path)
    source = driver.page_source
    assert "Server Error (500)" not in source and "Traceback" not in driver.title, path
    assert status_of(driver, path) == 200, path
    return source


def banners(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, "pf-banners").text


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_six_incidents_name_their_blocker_and_never_500(browser, live_server, django_user_model, redis_conn, tmp_path):  # noqa: F811
    from rq import Queue
    from rq.serializers import JSONSerializer
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from dispatch_app.models import DispatcherProcess, DomainPause
    from tests.integration.opsdata import ago, attempt_row, envelope, job, sql

    django_user_model.objects.create_superuser("ops", "ops@example.invalid", "ops-password")
    _login(browser, live_server)

    # 1. No worker: jobs in RQ, nobody listening.
    queued = []
    for i in range(3):
        j = job("delivery", "queued", dispatched_ago=60 - i)
        envelope(j, "dispatched", created_ago=61, dispatched_ago=60 - i)
        Queue("delivery", connection=redis_conn, serializer=JSONSerializer).enqueue(
            "dispatch_app.execution.execute", "delivery", j.pk, 1, job_id=rq_job_id(j.pk, 1)
        )
        queued.append(j)
    no_error_page(browser, live_server, DASHBOARD)
    assert "delivery: 3 job(s) waiting in RQ queue delivery" in banners(browser) and "no live worker" in banners(
        browser
    )
    shot(browser, tmp_path, "1-no-worker")
    no_error_page(browser, live_server, JOBS + "?stage=rq")
    cells = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-rq_side")]
    assert cells[0] == "#1 of 3 in delivery, 0 live workers"  # the queue's head first

    # 2. A killed worker holding a running job (its hash gone; another worker could be alive).
    held = job("agent", "running", dispatched_ago=70, started_ago=60, updated_ago=60)
    attempt_row(held, 1, worker="w-killed", created_ago=80, dispatched_ago=70, started_ago=60, with_envelope=False)
    no_error_page(browser, live_server, DASHBOARD)
    assert "agent: 1 running job(s) held by dead worker w-killed" in banners(browser)
    assert "RUNNING_STALE_SECONDS = 3600 s" in banners(browser)
    shot(browser, tmp_path, "2-killed-worker")

    # 3. A vendor failing every call: the failure alarm names the domain and the top error, with a Pause button.
    for _ in range(6):
        j = job("image_series", "running", started_ago=12)
        sql(
            "UPDATE dispatch_app_job SET status = 'failed', error = %s, finished_at = clock_timestamp() WHERE id = %s",
            ["dispatch_app.domains.providers.ProviderError: image vendor 503\n\nTraceback ...", j.pk],
        )
    no_error_page(browser, live_server, DASHBOARD)
    text = banners(browser)
    assert "image_series: 100% of its jobs failed in the last 5 min (6 of 6" in text
    assert "6 × dispatch_app.domains.providers.ProviderError: image vendor 503" in text
    shot(browser, tmp_path, "3-vendor-failing")
    browser.find_element(By.ID, "pf-banner-pause-image_series").click()
    WebDriverWait(browser, 15).until(lambda b: b.find_elements(By.ID, "pf-confirm-pause"))
    assert "100% of its jobs failed" in browser.find_element(By.ID, "pf-reason").get_attribute("value")
    browser.find_element(By.ID, "pf-confirm-pause").click()
    WebDriverWait(browser, 15).until(lambda b: b.find_elements(By.CSS_SELECTOR, "ul.messagelist"))
    assert DomainPause.objects.filter(domain="image_series", paused_by="ops").exists()

    # 4. Redis down: the page and its live part still load, and say Redis cannot be read.
    down = f"redis://127.0.0.1:{closed_port()}/0?socket_connect_timeout=1&socket_timeout=1"
    queues = {name: dict(entry, URL=down) for name, entry in settings.RQ_QUEUES.items()}
    for entry in queues.values():
        for key in ("HOST", "PORT", "DB", "UNIX_SOCKET_PATH"):
            entry.pop(key, None)
    with override_settings(RQ_QUEUES=queues):
        no_error_page(browser, live_server, DASHBOARD)
        assert "Redis cannot be read" in banners(browser)
        assert status_of(browser, DASHBOARD + "live/") == 200
        shot(browser, tmp_path, "4-redis-down")
        no_error_page(browser, live_server, JOBS)
        assert "Redis unreadable" in browser.find_element(By.ID, "result_list").text
        no_error_page(browser, live_server, f"{JOBS}{queued[0].pk}/timeline/")
        assert "Redis could not be read" in browser.find_element(By.ID, "pf-rq-state").text

    # 5. The dispatcher killed: its heartbeat went silent; due envelopes say nobody will send them, and their
    # age in the outbox is an alarm of its own.
    gone = DispatcherProcess.objects.create(name="h:9:killed", hostname="h", pid=9)
    sql(f"UPDATE dispatch_app_dispatcherprocess SET last_seen_at = {ago(600)} WHERE id = %s", [gone.pk])
    due = job("workflow", "submitted", submitted_ago=90)
    envelope(due, "pending", created_ago=90)
    no_error_page(browser, live_server, DASHBOARD)
    assert "No live dispatcher" in banners(browser) and "Dispatcher h:9:killed is STALE" in banners(browser)
    assert re.search(r"workflow: the oldest due envelope has waited 9\d\.\d s in the outbox", banners(browser))
    shot(browser, tmp_path, "5-dispatcher-killed")
    no_error_page(browser, live_server, f"{JOBS}{due.pk}/timeline/")
    assert browser.find_element(By.ID, "pf-blocker").text == "due, and no live dispatcher to send it"
    # A new dispatcher runs: both dispatcher alarms clear (the dead one stays in the table, replaced).
    new = DispatcherProcess.objects.create(name="h:10:new", hostname="h", pid=10)
    no_error_page(browser, live_server, DASHBOARD)
    assert "No live dispatcher" not in banners(browser) and "is STALE" not in banners(browser)
    assert "replaced" in browser.find_element(By.ID, "pf-processes").text
    shot(browser, tmp_path, "5-dispatcher-replaced")
    new.delete()

    # 6. Pause and backoff: a paused domain's job names who paused it and why; a retry in backoff says when.
    paused_job = job("image_series", "submitted", submitted_ago=20)
    envelope(paused_job, "pending", created_ago=20)
    backing_off = job("partial_edit", "submitted", attempt=2, submitted_ago=40)
    envelope(backing_off, "pending", attempt=2, created_ago=10, available_ago=-50)
    no_error_page(browser, live_server, f"{JOBS}{paused_job.pk}/timeline/")
    blocker = browser.find_element(By.ID, "pf-blocker").text
    assert blocker.startswith("dispatch of its domain paused by ops") and "100% of its jobs failed" in blocker
    assert "dispatch of image_series paused" in browser.find_element(By.ID, "pf-entries").text
    shot(browser, tmp_path, "6-paused")
    no_error_page(browser, live_server, f"{JOBS}{backing_off.pk}/timeline/")
    assert re.match(
        r"backoff before retry 1 \(attempt 2\): due in \d+\.\d s", browser.find_element(By.ID, "pf-blocker").text
    )
    no_error_page(browser, live_server, JOBS + "?domain__exact=partial_edit")
    assert "backoff before retry 1" in browser.find_element(By.ID, "result_list").text
    shot(browser, tmp_path, "6-backoff")


@pytest.mark.parametrize("width", [1280, 1920])
def test_pages_fit_the_window_without_a_horizontal_scroll(browser, live_server, django_user_model, redis_conn, width):  # noqa: F811
    from tests.integration.opsdata import attempt_row, envelope, job

    django_user_model.objects.create_superuser("ops", "ops@example.invalid", "ops-password")
    long_error = "dispatch_app.domains.providers.ProviderError: " + "a very long vendor error message " * 8
    for domain in ("delivery", "image_series", "agent", "workflow", "partial_edit"):
        j = job(domain, "failed", submitted_ago=100, finished_ago=5)
        attempt_row(
            j, 1, created_ago=100, dispatched_ago=90, started_ago=80, finished_ago=5, outcome="failed", error=long_error
        )
        w = job(domain, "submitted", attempt=2, submitted_ago=40)
        envelope(w, "pending", attempt=2, created_ago=10, available_ago=-50, send_attempts=3, last_error=long_error)
    for _ in range(5):  # a failure alarm with a long top error, and a paused domain with a long reason
        j = job("delivery", "failed", submitted_ago=30, finished_ago=2)
        attempt_row(
            j, 1, created_ago=30, dispatched_ago=20, started_ago=10, finished_ago=2, outcome="failed", error=long_error
        )
    from dispatch_app.actions import operator as actions

    actions.pause_domain("agent", reason="the vendor's status page says " + "degraded performance " * 10)
    browser.set_window_size(width, 1000)
    _login(browser, live_server)
    for path in (DASHBOARD, JOBS, f"{JOBS}{w.pk}/timeline/", "/admin/dispatch_app/dispatchenvelope/"):
        browser.get(live_server.url + path)
        scroll, inner = browser.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        widths = browser.execute_script(
            "return Array.from(document.querySelectorAll('#result_list thead th, #pf-domains thead th'))"
            ".map(th => th.className + '=' + Math.round(th.getBoundingClientRect().width))"
        )
        assert scroll <= inner, f"{path} at {width} px: {scroll} px wide in a {inner} px window; columns {widths}"
