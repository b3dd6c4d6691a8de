"""The RQ side on the operator's pages: a worker silent past its heartbeat periods is dead on any host (the
dashboard, the job list's "RQ side" column, the timeline), with the time since when; and every dashboard count
links to a list that holds what it counts. Real PostgreSQL and Redis; the worker hash is the one PipelineWorker
writes at birth (its heartbeat period in it), and a stopped beat is a last_heartbeat left in the past."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from rq import Queue
from rq.serializers import JSONSerializer
from rq.utils import utcformat

from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.state import queues as rqside
from dispatch_app.rq.worker import PipelineWorker
from dispatch_app.views import board
from tests.integration.admin.test_operator_dashboard import DASHBOARD, JOBS, LIVE, VIEW, enqueue, staff, worker
from tests.integration.opsdata import attempt_row, envelope, job

pytestmark = pytest.mark.version_dependent

INTERVAL = 10.0


def pipeline_worker(redis_conn, queue: str, name: str, *, hostname: str = "other-host") -> PipelineWorker:
    """A PipelineWorker's hash as it stands after birth, on another host (so no pid check can judge it)."""
    w = PipelineWorker(
        [Queue(queue, connection=redis_conn, serializer=JSONSerializer)],
        connection=redis_conn,
        name=name,
        heartbeat_interval=INTERVAL,
    )
    w.register_birth()
    redis_conn.hset(w.key, "hostname", hostname)
    return w


def beat_at(redis_conn, w, seconds_ago: float) -> datetime:
    """A worker's (or job's) last heartbeat ``seconds_ago`` by Redis' clock (what a stopped beat thread leaves)."""
    secs, micros = redis_conn.time()
    at = datetime.fromtimestamp(secs + micros / 1e6, tz=UTC) - timedelta(seconds=seconds_ago)
    redis_conn.hset(w.key, "last_heartbeat", utcformat(at))
    return at


def text(response) -> str:
    """The page as it reads: tags dropped, whitespace collapsed."""
    words = html.unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split()
    return " ".join(words).replace(" ,", ",").replace(" :", ":")


@pytest.mark.django_db
def test_a_silent_pipeline_worker_on_another_host_is_dead_since_its_last_heartbeat(client, redis_conn):
    w = pipeline_worker(redis_conn, "agent", "w-remote")
    assert redis_conn.hget(w.key, "pf_heartbeat_interval") == b"10.0"
    running = job("agent", "running", dispatched_ago=120, started_ago=100)
    rq_job = enqueue(redis_conn, "agent", running.pk)
    redis_conn.lrem("rq:queue:agent", 0, rq_job.id)
    w._write_start(rq_job, Queue("agent", connection=redis_conn, serializer=JSONSerializer))  # the worker's start
    beat_at(redis_conn, rq_job, 100)  # the job's own heartbeat: written when it started, 100 s ago
    waiting = job("agent", "queued", dispatched_ago=5)
    envelope(waiting, "dispatched", created_ago=6, dispatched_ago=5)
    enqueue(redis_conn, "agent", waiting.pk)
    client.force_login(staff("viewer", *VIEW))

    # Two periods late is still alive (one slow beat is not death) ...
    beat_at(redis_conn, w, 2 * INTERVAL)
    info = rqside.read_workers(redis_conn, ["w-remote"])["w-remote"]
    assert info.alive and info.dead_since is None
    assert "w-remote: alive" in text(client.get(f"{JOBS}?status__exact=running"))

    # ... three periods late is dead, since its last heartbeat, long before its hash expires (6 periods).
    last = beat_at(redis_conn, w, 3 * INTERVAL)
    info = rqside.read_workers(redis_conn, ["w-remote"])["w-remote"]
    assert not info.alive and info.dead_since == last.replace(microsecond=info.dead_since.microsecond)
    assert info.dead_reason == "no heartbeat for 30 s (it beats every 10 s)"
    assert redis_conn.exists(w.key)
    since = last.strftime("%Y-%m-%d %H:%M:%S UTC")

    page = text(client.get(f"{JOBS}{running.pk}/timeline/"))
    assert "Its worker w-remote is DEAD" in page and f"not alive since {since}" in page
    assert "no heartbeat for 30 s" in page
    listing = client.get(f"{JOBS}?domain__exact=agent").content.decode()
    assert f'<span class="pf-rq-side pf-red">w-remote: not alive since {since}; recovery takes it up' in listing
    assert '<span class="pf-rq-side pf-red">#1 of 1 in agent, 0 live workers</span>' in listing

    data = board.build(redis_conn=redis_conn)
    assert data["domains"]["agent"]["rq"]["live_workers"] == 0
    assert any(b["key"] == "no-worker" and b["text"].startswith("agent:") for b in data["banners"])
    (row,) = [w for w in data["rq"]["workers"] if w["name"] == "w-remote"]
    assert row["current_job"] == rq_job.id  # from RQ's executions set: PipelineWorker writes no current_job field
    assert row["dead_since"] == last.isoformat().replace(last.isoformat()[19:26], row["dead_since"][19:26])
    live = text(client.get(LIVE))
    assert f"DEAD, not alive since {since}" in live

    # Its beat resumes (a frozen process thawed, the network back): alive again at once.
    beat_at(redis_conn, w, 0)
    assert rqside.read_workers(redis_conn, ["w-remote"])["w-remote"].alive
    assert "w-remote: alive" in text(client.get(f"{JOBS}?status__exact=running"))


@pytest.mark.django_db
def test_a_worker_of_another_class_is_judged_by_its_hash_not_by_a_heartbeat_period(redis_conn):
    # A plain RQ worker heartbeats from its job loop (not during an in-process job): no period to hold it to.
    w = worker(redis_conn, "agent", name="w-plain")
    redis_conn.hset(w.key, "hostname", "other-host")
    beat_at(redis_conn, w, 10 * INTERVAL)
    assert rqside.read_workers(redis_conn, ["w-plain"])["w-plain"].alive
    redis_conn.delete(w.key)
    info = rqside.read_workers(redis_conn, ["w-plain"])["w-plain"]
    assert not info.alive and "hash is gone" in info.dead_reason


@pytest.mark.django_db
def test_the_job_list_shows_each_queued_jobs_place_and_the_local_workers_that_serve_it(client, redis_conn):
    jobs = [job("delivery", "queued", dispatched_ago=30 - i) for i in range(3)]
    for j in jobs:
        enqueue(redis_conn, "delivery", j.pk)
    lost = job("delivery", "queued", dispatched_ago=40)  # its RQ job never reached Redis (or Redis lost it)
    pipeline_worker(redis_conn, "delivery", "w-local-fresh")
    client.force_login(staff("viewer", *VIEW))
    listing = client.get(f"{JOBS}?domain__exact=delivery").content.decode()
    for position, j in enumerate(jobs, start=1):
        row = re.search(rf'<a href="[^"]*/{j.pk}/change/[^"]*">{j.pk}</a>.*?</tr>', listing, re.S).group(0)
        assert f"#{position} of 3 in delivery, 1 live worker<" in row
    row = re.search(rf'<a href="[^"]*/{lost.pk}/change/[^"]*">{lost.pk}</a>.*?</tr>', listing, re.S).group(0)
    assert '<span class="pf-rq-side pf-red">not in Redis</span>' in row


@pytest.mark.django_db
def test_every_dashboard_count_links_to_a_list_holding_what_it_counts(client, redis_conn):
    due = job("delivery", "submitted", submitted_ago=20)
    envelope(due, "pending", created_ago=20, available_ago=5)
    later = job("delivery", "submitted", submitted_ago=20)
    envelope(later, "pending", created_ago=20, available_ago=-600)  # a retry backoff: not due for 10 min
    started = job("agent", "running", dispatched_ago=70, started_ago=60)
    job("agent", "running", dispatched_ago=900, started_ago=800)  # started before the 5 min window
    client.force_login(staff("viewer", *VIEW))

    page = client.get(DASHBOARD).content.decode()
    links = dict(re.findall(r'<a href="([^"]+)"[^>]*>\s*([\d.]+)\s*</a>', page))
    due_link = next(href for href, n in links.items() if "due=now" in href and "domain__exact=delivery" in href)
    assert links[due_link] == "1"
    envelopes = client.get(html.unescape(due_link)).content.decode()
    assert f"job {due.pk}<" in envelopes and f"job {later.pk}<" not in envelopes
    started_link = next(href for href in links if "started_within=5m" in href and "domain__exact=agent" in href)
    assert links[started_link] == "0.2"  # one start in 5 minutes
    jobs_page = client.get(html.unescape(started_link)).content.decode()
    assert set(re.findall(r"/admin/dispatch_app/job/(\d+)/change/", jobs_page)) == {str(started.pk)}
    assert 'href="#pf-workers"' in page  # live workers: the RQ workers table below


@pytest.mark.django_db
def test_a_job_taken_but_not_started_by_a_dead_worker_names_that_worker(client, redis_conn):
    from rq.job import Job as RQJob

    from dispatch_app.rq.worker.fetch import Fetcher

    w = pipeline_worker(redis_conn, "agent", "w-taker")
    held = job("agent", "queued", dispatched_ago=50)
    enqueue(redis_conn, "agent", held.pk)
    queue = Queue("agent", connection=redis_conn, serializer=JSONSerializer)
    (taken,) = Fetcher(redis_conn, [queue], RQJob, JSONSerializer, "w-taker").take(8)  # prefetched, not started
    assert taken.job.id == rq_job_id(held.pk, 1) and redis_conn.llen("rq:queue:agent") == 0
    client.force_login(staff("viewer", *VIEW))

    beat_at(redis_conn, w, 0)
    assert "taken by w-taker (not started yet)" in text(client.get(f"{JOBS}?domain__exact=agent"))
    last = beat_at(redis_conn, w, 3 * INTERVAL)
    since = last.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"taken by w-taker, not alive since {since}" in text(client.get(f"{JOBS}?domain__exact=agent"))
    page = text(client.get(f"{JOBS}{held.pk}/timeline/"))
    assert f"by worker w-taker, not started yet: DEAD, not alive since {since}" in page
    redis_conn.delete(w.key)  # its hash expired: when it last beat is no longer known
    assert "taken by w-taker, not alive since an unknown time" in text(client.get(f"{JOBS}?domain__exact=agent"))


@pytest.mark.django_db
def test_no_count_on_the_dashboard_is_without_its_link(client, redis_conn):
    j = job("delivery", "failed", dispatched_ago=70, started_ago=60, finished_ago=50)
    envelope(j, "dispatched", created_ago=71, dispatched_ago=70)
    client.force_login(staff("viewer", *VIEW))
    live = client.get(LIVE).content.decode()
    checked = 0
    for table in ("pf-domains", "pf-rq", "pf-failures"):
        body = re.search(rf'<table id="{table}">(.*?)</table>', live, re.S).group(1)
        for cell in re.findall(r'<td class="num[^"]*">(.*?)</td>', body, re.S):
            shown = " ".join(re.sub(r"<[^>]+>", " ", cell).split())
            counts = re.findall(r"(?<![\d.%])\d+(?:\.\d+)?(?![\d.]*\s*(?:ms|s|min|h|%))", shown)
            if re.fullmatch(r"[\d./ ]+|\d+% of \d+|\d+ \(of \d+ registered\)", shown):
                assert len(re.findall(r"<a ", cell)) >= len(counts) - ("registered" in shown), (table, shown)
                checked += len(counts)
    assert checked > 50


@pytest.mark.django_db
def test_a_banners_list_link_opens_the_list_with_its_filters_selected(client, redis_conn):
    """The banner's "list" holds what the banner counts, and the list's side bar says so (not domain "All")."""
    queued = [job("delivery", "queued", dispatched_ago=70) for _ in range(2)]
    job("agent", "queued", dispatched_ago=70)  # another domain's queued job: not in delivery's list
    dead = job("delivery", "failed")
    envelope(dead, "dead", created_ago=30)
    envelope(job("agent", "failed"), "dead", created_ago=30)
    client.force_login(staff("viewer", *VIEW))
    live = client.get(LIVE).content.decode()

    def banner_link(key: str) -> str:
        found = re.search(rf'data-key="{key}">delivery:[^<]*<a href="([^"]+)">list</a>', live)
        assert found, (key, live)
        return html.unescape(found.group(1))

    def selected(page: str, title: str) -> str:
        block = re.search(rf'<details data-filter-title="{title}"[^>]*>(.*?)</details>', page, re.S).group(1)
        return re.search(r'<li class="selected">\s*<a[^>]*>(.*?)</a>', block, re.S).group(1).strip()

    page = client.get(banner_link("no-worker")).content.decode()
    assert set(re.findall(r"/admin/dispatch_app/job/(\d+)/change/", page)) == {str(j.pk) for j in queued}
    assert selected(page, "domain") == "delivery" and selected(page, "waiting in") == "RQ queue"
    page = client.get(banner_link("dead-envelopes")).content.decode()
    assert re.findall(r">job (\d+)</a>", page) == [str(dead.pk)]
    assert selected(page, "domain") == "delivery" and selected(page, "status") == "Dead"


@pytest.mark.django_db
def test_the_domain_charts_count_each_attempt_in_its_minute_with_the_p95_waits(redis_conn):
    """Dispatches and waits by dispatch minute, finishes and failures by finish minute, per domain; a retried job's
    first attempt (superseded after starting) is a finish of that attempt, its failure counts once."""
    from django.db import connection

    from tests.integration.opsdata import attempt_row, percentile_cont

    # Minute 2 ago (dispatched 150 s ago): three delivery attempts with outbox waits 1, 2, 4 s and RQ waits 0.5, 1, 3 s.
    outbox, rq = [1.0, 2.0, 4.0], [0.5, 1.0, 3.0]
    for i, (o, q) in enumerate(zip(outbox, rq, strict=True)):
        j = job("delivery", "succeeded" if i else "failed")
        attempt_row(
            j,
            1,
            outcome="succeeded" if i else "failed",
            created_ago=150 + o,
            due_ago=150 + o,
            dispatched_ago=150,
            started_ago=150 - q,
            finished_ago=30,
        )
    # Minute 0: one agent attempt dispatched, not started yet (counted from its envelope), and a workflow job whose
    # first attempt was superseded after it started (a recovery re-dispatch) and whose second ended outcome_unknown.
    attempt_row(job("agent", "queued"), 1, created_ago=10, dispatched_ago=9)
    w = job("workflow", "outcome_unknown", attempt=2)
    attempt_row(w, 1, outcome="superseded", created_ago=40, dispatched_ago=39, started_ago=38, finished_ago=20)
    attempt_row(w, 2, outcome="outcome_unknown", created_ago=20, dispatched_ago=19, started_ago=18, finished_ago=5)
    with connection.cursor() as cursor:
        charts = board.charts(cursor)

    def at(domain, minutes_ago):
        (point,) = [p for p in charts[domain] if p["minutes_ago"] == minutes_ago]
        return point

    assert len(charts["delivery"]) == 60 and charts["delivery"][0]["minutes_ago"] == 59  # oldest first
    d2 = at("delivery", 2)
    assert d2["dispatched"] == 3
    assert d2["outbox_p95"] == pytest.approx(percentile_cont(outbox, 0.95), abs=0.01)
    assert d2["rq_p95"] == pytest.approx(percentile_cont(rq, 0.95), abs=0.01)
    assert (at("delivery", 0)["finished"], at("delivery", 0)["failed"]) == (3, 1)
    assert sum(p["dispatched"] for p in charts["delivery"]) == 3
    assert (at("agent", 0)["dispatched"], at("agent", 0)["rq_p95"]) == (1, None)
    assert at("workflow", 0)["dispatched"] == 2 and at("workflow", 0)["finished"] == 2
    assert sum(p["failed"] for p in charts["workflow"]) == 1


@pytest.mark.django_db
def test_a_workers_counts_link_to_the_jobs_it_ran(client, redis_conn):
    w = pipeline_worker(redis_conn, "delivery", "w-counted")
    beat_at(redis_conn, w, 0)
    ran = job("delivery", "running", dispatched_ago=30, started_ago=20)
    other = job("delivery", "running", dispatched_ago=30, started_ago=20)
    # The attempt history names the worker that started each attempt.
    attempt_row(ran, 1, worker="w-counted", dispatched_ago=30, started_ago=20)
    attempt_row(other, 1, worker="w-other", dispatched_ago=30, started_ago=20)
    client.force_login(staff("viewer", *VIEW))

    live = client.get(LIVE).content.decode()
    row = re.search(r'<tr class="pf-worker"><th>w-counted</th>.*?</tr>', live, re.S).group(0)
    # Two links: RQ's counts (every job it ran) and PostgreSQL's outcomes of the last hour.
    href, recent = re.findall(r'<a href="([^"]*\?worker=[^"]+)"', row)
    assert "finished_within=1h" in recent
    page = client.get(html.unescape(href)).content.decode()
    assert set(re.findall(r"/admin/dispatch_app/job/(\d+)/change/", page)) == {str(ran.pk)}
