"""The admin in a real headless Chromium, as an on-call operator meets it.

One pass over rows written directly (login, dashboard, timeline), and one through real trouble made on purpose with
real processes: a backlog in RQ with no worker, a worker killed with SIGKILL mid-job, a failure burst from a vendor
failing every call, and a bulk retry of the failed jobs behind its confirmation page. Each step asserts what the
page shows (text, banners, counts), and the dashboard must update itself without a reload.

Needs Debian's ``chromium`` and ``chromium-driver`` (CI installs both); skipped with a message otherwise.
Saves the dashboard screenshot the README shows (docs/img/dashboard.png) with PRODUCTFLOW_SCREENSHOTS=1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from dispatch_app.models import JobEvent, RecoveryRound
from tests.helpers import MANAGE, PYTHON, ROOT, wait_until

CHROMIUM = Path("/usr/bin/chromium")
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists() or not Path(DRIVER).exists(),
        reason="no /usr/bin/chromium + chromedriver: apt-get install -y chromium chromium-driver",
    ),
    pytest.mark.version_dependent,
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

    browser.get(f"{live_server.url}/admin/dispatch_app/job/{waiting.pk}/timeline/")
    assert browser.find_element(By.ID, "pf-stage").text == "outbox"
    text = browser.find_element(By.ID, "pf-entries").text
    assert "recovery_left_alone" in text and "envelope still pending" in text


# --- Real trouble, real processes -----------------------------------------------------------------------------


def _login(browser, live_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys("ops-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 15).until(expected_conditions.title_contains("Site administration"))


class Workers:
    """``manage.py runworkers`` processes (each in its own process group, killed with it at the end)."""

    def __init__(self, env: dict, tmp: Path):
        self.env, self.tmp, self.procs = env, tmp, []

    def start(self, queue: str, **env) -> subprocess.Popen:
        log = open(self.tmp / f"worker-{queue}-{len(self.procs)}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [PYTHON, MANAGE, "runworkers", "--queues", queue, "--processes", "1"],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((proc, log))
        return proc

    def close(self) -> None:
        for proc, log in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            log.close()


def _dispatch_all() -> int:
    from dispatch_app.config.settings import dispatch_settings
    from dispatch_app.dispatch.loop import DispatchLoop

    loop = DispatchLoop(dispatch_settings())
    try:
        return loop.run_once("catch_up").dispatched
    finally:
        loop.close()


def _fresh(read, tries: int = 10):
    """Read the page again if the dashboard's live refresh replaced the element between find and read.

    The refresh swaps the live part at most every few seconds, so a second find sees the new, whole DOM.
    """
    from selenium.common.exceptions import StaleElementReferenceException

    for attempt in range(tries):
        try:
            return read()
        except StaleElementReferenceException:
            if attempt == tries - 1:
                raise


def _text(browser, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return _fresh(lambda: browser.find_element(By.ID, element_id).text)


def test_no_worker_backlog_killed_worker_failure_burst_and_bulk_retry(
    browser, live_server, django_user_model, subprocess_env, tmp_path
):
    from django.contrib.admin.models import LogEntry
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from dispatch_app.models import Job
    from dispatch_app.outbox.submit import submit_many
    from dispatch_app.rq.state import jobs as rqjobs
    from dispatch_app.rq.state import queues as rqside
    from tests.factories import PAYLOADS

    django_user_model.objects.create_superuser("ops", "ops@example.invalid", "ops-password")
    workers = Workers(dict(subprocess_env, MEDIA_ROOT=str(tmp_path)), tmp_path)
    dashboard = f"{live_server.url}/admin/dispatch_app/job/dashboard/"
    try:
        # 1. A backlog in RQ and no worker: red, with the count, and the job's place in its queue.
        backlog = submit_many([("delivery", dict(PAYLOADS["delivery"], asset=f"a-{i}")) for i in range(6)])
        assert _dispatch_all() == 6
        _login(browser, live_server)
        assert "Dispatch dashboard" in browser.find_element(By.ID, "pf-dashboard-link").text  # from the admin index
        browser.get(dashboard)
        banners = _text(browser, "pf-banners")
        assert "No live dispatcher" in banners
        assert "delivery: 6 job(s) waiting in RQ queue delivery (6 queued in PostgreSQL) and no live worker" in banners
        cell_text, cell_class = _fresh(
            lambda: (
                (cell := browser.find_element(By.CSS_SELECTOR, "#pf-rq-delivery .pf-live-workers")).text,
                cell.get_attribute("class"),
            )
        )
        assert cell_text == "0" and "pf-red" in cell_class
        browser.get(f"{live_server.url}/admin/dispatch_app/job/{backlog[-1].pk}/timeline/")
        assert _text(browser, "pf-rq-position") == "6"
        assert _text(browser, "pf-rq-workers") == "0 live workers serve it"
        browser.get(f"{live_server.url}/admin/dispatch_app/job/?domain__exact=delivery&stage=rq")
        rq_side = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-rq_side")]
        assert rq_side == [f"#{n} of 6 in delivery, 0 live workers" for n in range(1, 7)]  # the queue's head first

        # 2. A worker on another host killed with SIGKILL in the middle of a job (a vendor call that takes
        #    minutes). No pid check reaches another host and its hash is kept (RQ's own workers keep theirs for
        #    minutes): only the heartbeat it stopped writing can tell, within 2.5 of its periods.
        workers.start(
            "agent",
            DISPATCH_PROVIDER_LATENCY_MS="300000",
            DISPATCH_PROVIDER_TIMEOUT="600",
            DISPATCH_WORKER_HEARTBEAT_INTERVAL="2",
        )
        (stuck,) = submit_many([("agent", PAYLOADS["agent"])])
        assert _dispatch_all() == 1
        wait_until(
            lambda: Job.objects.filter(pk=stuck.pk, status="running").exists(), 60, message="the agent job to start"
        )
        state = rqjobs.job_state(stuck.pk, 1, "agent")
        victim = state.worker or next(w.name for w in _live_workers("agent"))
        conn, key = rqside.redis_conn("agent"), rqside.WORKER_PREFIX + victim
        conn.hset(key, "hostname", "other-host")
        running = f"{live_server.url}/admin/dispatch_app/job/?domain__exact=agent&status__exact=running"
        browser.get(running)
        assert _text(browser, "result_list").count(f"{victim}: alive") == 1
        pid = rqside.read_workers(conn, [victim])[victim].pid
        os.kill(pid, signal.SIGKILL)
        # The signal lands asynchronously: wait (bounded) until the process is gone or a zombie, then look.
        wait_until(lambda: not rqside.pid_alive(pid), 10, message=f"worker pid {pid} to die")
        conn.persist(key)
        WebDriverWait(browser, 30).until(
            lambda b: b.refresh() or f"{victim}: not alive since" in b.find_element(By.ID, "result_list").text
        )
        browser.get(f"{live_server.url}/admin/dispatch_app/job/{stuck.pk}/timeline/")
        assert _text(browser, "pf-stage") == "worker"
        where = _text(browser, "pf-rq-state")
        # Seen dead by its PostgreSQL session (dispatch_app.db.liveness) or, failing that, by its silent heartbeat.
        assert f"Its worker {victim} is DEAD, not alive since " in where, where
        assert "its PostgreSQL session is gone" in where or (
            "no heartbeat for" in where and "(it beats every 2 s)" in where
        ), where

        # 3. A failure burst: a worker comes for the delivery backlog, and the vendor fails every call.
        #    The dashboard, left open, shows it without a reload.
        browser.get(dashboard)
        browser.execute_script("document.getElementById('pf-live').dataset.marker = 'same page'")
        workers.start(
            "delivery", DISPATCH_PROVIDER_FAILURE_RATE="1.0", DISPATCH_RECOVERY='{"delivery": {"MAX_ATTEMPTS": 1}}'
        )
        ids = [j.pk for j in backlog]
        wait_until(
            lambda: Job.objects.filter(pk__in=ids, status="failed").count() == 6, 90, message="6 delivery failures"
        )
        failed_cell = "#pf-fail-delivery td:nth-child(3) a"
        WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda b: b.find_element(By.CSS_SELECTOR, failed_cell).text == "6"
        )
        assert browser.execute_script("return document.getElementById('pf-live').dataset.marker") == "same page"
        assert "100% of 6" in _text(browser, "pf-fail-delivery")
        no_worker = _fresh(
            lambda: [b.text for b in browser.find_elements(By.CSS_SELECTOR, "#pf-banners [data-key=no-worker]")]
        )
        assert not [text for text in no_worker if text.startswith("delivery:")]
        assert f"{victim} other-host" in _text(browser, "pf-workers").replace(" /", "")
        assert "DEAD, not alive since" in _text(browser, "pf-workers")
        # The hour's chart of the domain: its dispatches and failures, minute by minute (bar titles).
        bars = _fresh(
            lambda: [
                e.get_attribute("textContent")
                for e in browser.find_elements(By.CSS_SELECTOR, "#pf-chart-delivery svg rect title")
            ]
        )
        counted = {"dispatched": 0, "failed": 0}
        for title in bars:
            count, what = title.split(": ")[1].split(" ", 1)
            counted[what] += int(count)
        assert counted == {"dispatched": 6, "failed": 6}, bars
        assert _fresh(
            lambda: browser.find_elements(
                By.CSS_SELECTOR, "#pf-chart-delivery svg polyline, #pf-chart-delivery svg circle"
            )
        )  # finished, p95 waits
        # The README's screenshot is refreshed only on request (PRODUCTFLOW_SCREENSHOTS=1), so a test run leaves
        # the tree clean; the admin's side bar is folded away and the window made tall enough for the tables.
        out = (ROOT / "docs" / "img" if os.environ.get("PRODUCTFLOW_SCREENSHOTS") else tmp_path) / "dashboard.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        browser.find_element(By.ID, "toggle-nav-sidebar").click()
        browser.set_window_size(1500, 1900)
        assert browser.save_screenshot(str(out))
        assert out.stat().st_size > 10_000
        browser.set_window_size(1500, 1100)

        # 4. Bulk retry from the count's deep link: select all, "Retry now", the confirmation page, confirm.
        _fresh(lambda: browser.find_element(By.CSS_SELECTOR, failed_cell).click())
        WebDriverWait(browser, 15).until(lambda b: "Select job to" in b.title or "Select job" in b.page_source)
        rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
        assert len(rows) == 6
        browser.find_element(By.ID, "action-toggle").click()
        Select(browser.find_element(By.NAME, "action")).select_by_value("retry_now")
        browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
        WebDriverWait(browser, 15).until(lambda b: b.find_elements(By.ID, "pf-confirm-retry"))
        plan = _text(browser, "pf-plan-delivery")
        assert "failed 6" in plan and "yes" in plan
        assert Job.objects.filter(pk__in=ids, attempt=1, status="failed").count() == 6  # nothing before confirming
        browser.find_element(By.ID, "pf-confirm-retry").click()
        WebDriverWait(browser, 15).until(lambda b: b.find_elements(By.CSS_SELECTOR, "ul.messagelist"))
        assert "re-dispatched as attempt 2 (was failed)" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
        assert Job.objects.filter(pk__in=ids, attempt=2, status="submitted").count() == 6
        assert LogEntry.objects.filter(user__username="ops", object_id__in=[str(i) for i in ids]).count() == 6
        browser.get(f"{live_server.url}/admin/")
        assert "job " + str(ids[0]) in browser.find_element(By.ID, "recent-actions-module").text
    finally:
        workers.close()


def _live_workers(queue: str):
    from dispatch_app.rq.state import queues as rqside

    names = [m.decode().removeprefix(rqside.WORKER_PREFIX) for m in rqside.redis_conn().smembers(f"rq:workers:{queue}")]
    return [w for w in rqside.read_workers(rqside.redis_conn(), names).values() if w.alive]
