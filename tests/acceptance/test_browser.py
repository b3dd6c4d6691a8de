"""One end-to-end pass in a real headless Chromium: log into the admin, load the dashboard and a timeline.

Needs Debian's ``chromium`` and ``chromium-driver`` (CI installs both); skipped with a message otherwise.
Saves the dashboard screenshot the README shows: docs/img/dashboard.png.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from dispatch_app.models import JobEvent, RecoveryRound
from tests.helpers import ROOT

CHROMIUM = Path("/usr/bin/chromium")
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists() or not Path(DRIVER).exists(),
        reason="no /usr/bin/chromium + chromedriver: apt-get install -y chromium chromium-driver",
    ),
]


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in requirements/test.txt")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pf-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1500,1100",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _scenario():
    from tests.integration.opsdata import ago, envelope, job, sql

    for i, wait in enumerate([0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3.0, 0.3]):
        envelope(
            job("image_series", "queued"), "dispatched", created_ago=60 * i + 30 + wait, dispatched_ago=60 * i + 30
        )
    waiting = job("delivery", "submitted", updated_ago=95, submitted_ago=95)
    envelope(waiting, "pending", created_ago=95, available_ago=-20, send_attempts=2, last_error="ConnectionError")
    JobEvent.objects.create(job=waiting, attempt=1, kind="send_failed", reason="ConnectionError: redis timeout")
    JobEvent.objects.create(job=waiting, attempt=1, kind="recovery_left_alone", reason="envelope still pending")
    r = RecoveryRound.objects.create(domain="delivery", scanned=4, redispatched=1, left_alone=3)
    sql(f"UPDATE dispatch_app_recoveryround SET finished_at = {ago(0)} WHERE id = %s", [r.pk])
    from dispatch_app.models import DispatcherProcess, LoopHeartbeat

    process = DispatcherProcess.objects.create(name="ops-host:4242:demo", hostname="ops-host", pid=4242)
    for loop, tick_ago in (("dispatch", 0.4), ("heartbeat", 2), ("recovery-delivery", 25), ("retention", 45)):
        hb = LoopHeartbeat.objects.create(process=process, loop=loop)
        sql(f"UPDATE dispatch_app_loopheartbeat SET last_tick_at = {ago(tick_ago)} WHERE id = %s", [hb.pk])
    return waiting


def test_admin_login_dashboard_and_timeline_in_headless_chromium(browser, live_server, django_user_model, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    django_user_model.objects.create_superuser("ops", "ops@example.invalid", "ops-password")
    waiting = _scenario()

    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys("ops-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # The click starts a navigation; wait (bounded) for the page it leads to, not for time.
    WebDriverWait(browser, 15).until(expected_conditions.title_contains("Site administration"))
    assert "Site administration" in browser.page_source

    browser.get(f"{live_server.url}/admin/dispatch_app/job/dashboard/")
    assert browser.find_element(By.ID, "pf-domain-delivery").is_displayed()
    assert browser.find_elements(By.CSS_SELECTOR, "svg.pf-chart rect")  # the chart has bars
    # The README's screenshot is refreshed only on request (PRODUCTFLOW_SCREENSHOTS=1),
    # so a test run leaves the tree clean.
    out = (ROOT / "docs" / "img" if os.environ.get("PRODUCTFLOW_SCREENSHOTS") else tmp_path) / "dashboard.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(out))
    assert out.stat().st_size > 10_000

    browser.get(f"{live_server.url}/admin/dispatch_app/job/{waiting.pk}/timeline/")
    assert browser.find_element(By.ID, "pf-stage").text == "outbox"
    text = browser.find_element(By.ID, "pf-entries").text
    assert "recovery_left_alone" in text and "envelope still pending" in text
