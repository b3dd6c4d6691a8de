"""The dashboard renders (200, through the test client) whatever it reports on has failed: Redis down, one
domain's Redis server down, jobs and envelopes of unregistered domains, empty tables. The banner says what
is unreadable. board.build() alone is not enough: the 500s were in the templates' filters. PostgreSQL slow: a
table held by a second real session makes one section time out (DASHBOARD_STATEMENT_TIMEOUT), and only that one."""

from __future__ import annotations

import socket
from contextlib import contextmanager

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import override_settings

from dispatch_app.domains import all_domains
from dispatch_app.models import Job
from tests.integration.opsdata import envelope, job

pytestmark = pytest.mark.version_dependent

DASHBOARD = "/admin/dispatch_app/job/dashboard/"
PAGES = (DASHBOARD, DASHBOARD + "live/", DASHBOARD + "data.json", "/admin/dispatch_app/job/")


def closed_port() -> int:
    """A local port nobody listens on (bound then released: connecting to it is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def queues_on(url: str, only=None) -> dict:
    """RQ_QUEUES with every domain queue (or those in ``only``) on ``url``."""
    out = {name: dict(entry) for name, entry in settings.RQ_QUEUES.items()}
    for domain in all_domains():
        if only is None or domain.queue in only:
            entry = dict(out.get(domain.queue) or out["default"])
            for key in ("HOST", "PORT", "DB", "PASSWORD", "UNIX_SOCKET_PATH"):
                entry.pop(key, None)
            entry["URL"] = url
            out[domain.queue] = entry
    return out


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("op", password="pw"))
    return client


def busy_tables():
    """A job in every stage, in a registered and an unregistered domain."""
    for domain in ("delivery", "retired"):
        waiting = job(domain, "submitted", submitted_ago=30)
        envelope(waiting, "pending", created_ago=30)
        queued = job(domain, "queued", submitted_ago=60, dispatched_ago=50)
        envelope(queued, "dispatched", created_ago=60, dispatched_ago=50)
        job(domain, "running", submitted_ago=90, dispatched_ago=80, started_ago=70)
        job(domain, "failed", submitted_ago=90, dispatched_ago=80, started_ago=70, finished_ago=10)
    gone = job("retired", "failed", submitted_ago=120)
    envelope(gone, "dead", created_ago=120)


def get_all(client) -> dict[str, str]:
    out = {}
    for url in PAGES:
        response = client.get(url)
        assert response.status_code == 200, (url, response.content[-2000:])
        out[url] = response.content.decode()
    return out


@pytest.mark.django_db
def test_empty_tables_render(operator, redis_conn):
    pages = get_all(operator)
    assert 'id="pf-domains"' in pages[DASHBOARD] and 'id="pf-rq"' in pages[DASHBOARD + "live/"]


@pytest.mark.django_db
def test_unregistered_domains_jobs_and_envelopes_render(operator, redis_conn):
    busy_tables()
    pages = get_all(operator)
    assert "retired" in pages[DASHBOARD] and "(not registered)" in pages[DASHBOARD + "live/"]


@pytest.mark.django_db
def test_redis_down_renders_and_says_redis_cannot_be_read(operator):
    busy_tables()
    down = f"redis://127.0.0.1:{closed_port()}/0?socket_connect_timeout=1&socket_timeout=1"
    with override_settings(RQ_QUEUES=queues_on(down)):
        pages = get_all(operator)
    for url in (DASHBOARD, DASHBOARD + "live/"):
        assert 'data-key="redis"' in pages[url] and "Redis cannot be read" in pages[url]
    assert "Redis unreadable" in pages["/admin/dispatch_app/job/"]  # the list's RQ-side column
    with override_settings(RQ_QUEUES=queues_on(down)):
        for j in Job.objects.filter(status__in=("queued", "running")):
            assert operator.get(f"/admin/dispatch_app/job/{j.pk}/timeline/").status_code == 200


@pytest.mark.django_db
def test_one_domains_redis_down_renders_the_others_and_names_the_server(operator, redis_conn):
    busy_tables()
    port = closed_port()
    down = f"redis://127.0.0.1:{port}/0?socket_connect_timeout=1&socket_timeout=1"
    with override_settings(RQ_QUEUES=queues_on(down, only={"agent"})):
        pages = get_all(operator)
    live = pages[DASHBOARD + "live/"]
    assert 'data-key="redis"' in live and f"127.0.0.1:{port}" in live
    # The servers that answer are still read: delivery's queue row has numbers, agent's says unknown.
    assert 'id="pf-rq-delivery"' in live
    agent_row = live.split('id="pf-rq-agent"')[1].split("</tr>")[0]
    assert "not read" in agent_row
    delivery_row = live.split('id="pf-rq-delivery"')[1].split("</tr>")[0]
    assert "not read" not in delivery_row


@pytest.mark.django_db
def test_a_domain_whose_redis_is_down_raises_no_dead_worker_banner_for_its_running_jobs(operator, redis_conn):
    from dispatch_app.views import board
    from tests.integration.opsdata import attempt_row

    held = job("agent", "running", dispatched_ago=70, started_ago=60)
    attempt_row(held, 1, worker="w-somewhere", created_ago=80, dispatched_ago=70, started_ago=60, with_envelope=False)
    down = f"redis://127.0.0.1:{closed_port()}/0?socket_connect_timeout=1&socket_timeout=1"
    with override_settings(RQ_QUEUES=queues_on(down, only={"agent"})):
        data = board.build()
    keys = [b["key"] for b in data["banners"]]
    assert "redis" in keys and "dead-worker-holds" not in keys  # unknown, not dead
    data = board.build()  # agent's server readable again: w-somewhere is nowhere in Redis, so dead
    assert "dead-worker-holds" in [b["key"] for b in data["banners"]]


@pytest.fixture
def private_redis():
    from tests.private_servers import PrivateRedis, make_base_dir, remove_tree

    base = make_base_dir("pf-render-")
    server = PrivateRedis(base)
    server.start()
    yield server
    server.stop()
    remove_tree(base)


@pytest.mark.django_db
def test_a_redis_that_stops_while_the_page_is_open_keeps_it_rendering(operator, private_redis):
    """The real outage: the page read Redis (pooled connections), then the server is killed."""
    busy_tables()
    url = private_redis.url + "&socket_timeout=1&socket_connect_timeout=1"
    with override_settings(RQ_QUEUES=queues_on(url)):
        before = get_all(operator)
        assert 'data-key="redis"' not in before[DASHBOARD + "live/"]
        private_redis.stop()
        after = get_all(operator)
    for page in (DASHBOARD, DASHBOARD + "live/"):
        assert 'data-key="redis"' in after[page] and "Redis cannot be read" in after[page]


@contextmanager
def table_locked(table: str):
    """A second, real session holds ``table`` in ACCESS EXCLUSIVE mode (as an ALTER TABLE or VACUUM FULL would):
    every read of it waits until this session ends. The page's request runs in this thread meanwhile; nothing
    here needs to act while it waits, so no thread, event or sleep is involved."""
    from dispatch_app.db.liveness import django_conninfo

    with psycopg.connect(**django_conninfo()) as holder:
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            holder.rollback()


# The locked section waits for as long as it is allowed, whatever the limit; the others must finish inside it. Late
# in a full CI run on a slow 2-core host (tables bloated by earlier tests, autovacuum behind) an unlocked section
# took over 0.2 s, so tests asserting "only that one" give the others this much instead; each locked section costs
# the test this long.
OTHERS_READ_WITHIN = 1.5


def statement_timeout() -> str:
    from tests.integration.opsdata import sql

    return sql("SHOW statement_timeout")[0][0]


@pytest.mark.django_db
def test_postgresql_slow_one_section_times_out_alone_and_the_page_names_it(operator, redis_conn):
    busy_tables()
    before = statement_timeout()
    with (
        table_locked("dispatch_app_recoveryround"),
        override_settings(DISPATCH={"DASHBOARD_STATEMENT_TIMEOUT": OTHERS_READ_WITHIN}),
    ):
        responses = {url: operator.get(url) for url in PAGES[:3]}
    assert {url: r.status_code for url, r in responses.items()} == dict.fromkeys(PAGES[:3], 200)
    for url in (DASHBOARD, DASHBOARD + "live/"):
        page = responses[url].content.decode()
        assert 'data-key="db-unreadable"' in page
        assert (
            "PostgreSQL: recovery rounds cannot be read (QueryCanceled: canceling statement due to statement " in page
        )
        assert 'class="pf-red pf-unreadable">unreadable: QueryCanceled' in page  # the recovery table says so
        # Every other section was read: delivery's row has its counts, and only recovery is missing.
        row = page.split('id="pf-domain-delivery"')[1].split("</tr>")[0]
        assert ">1</a>" in row and "–</a>" not in row
        assert page.count('data-key="db-unreadable"') == 1
    data = responses[DASHBOARD + "data.json"].json()
    assert list(data["unreadable"]) == ["recovery"]
    assert data["domains"]["delivery"]["backlog"] == {"submitted": 1, "queued": 1, "running": 1}
    assert data["dispatchers"] == [] and "no-dispatcher" in [b["key"] for b in data["banners"]]
    # The sections ran as savepoints of this test's transaction: its own statement_timeout is untouched.
    assert statement_timeout() == before


@pytest.mark.django_db
def test_unreadable_dispatchers_are_not_no_dispatcher(operator, redis_conn):
    with (
        table_locked("dispatch_app_dispatcherprocess"),
        override_settings(DISPATCH={"DASHBOARD_STATEMENT_TIMEOUT": 0.2}),
    ):
        response = operator.get(DASHBOARD + "live/")
        data = operator.get(DASHBOARD + "data.json").json()
    assert response.status_code == 200
    page = response.content.decode()
    assert "PostgreSQL: dispatcher processes cannot be read" in page and "dispatcher processes unreadable:" in page
    assert data["dispatchers"] is None and "no-dispatcher" not in [b["key"] for b in data["banners"]]


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_each_section_is_its_own_and_its_timeout_ends_with_it(redis_conn):
    """As in production (autocommit views): each section a real transaction, SET LOCAL gone at its end."""
    from dispatch_app.views import board

    before = statement_timeout()
    with (
        table_locked("dispatch_app_jobattempt"),
        override_settings(DISPATCH={"DASHBOARD_STATEMENT_TIMEOUT": OTHERS_READ_WITHIN}),
    ):
        data = board.build(redis_conn=redis_conn)
    # Every section reading attempts timed out; the others (envelopes, recovery, dispatchers, pauses) were read.
    assert {"jobs", "latency", "failures", "charts", "failure_alarms", "outbox_due"} <= set(data["unreadable"])
    assert not {"envelopes", "recovery", "dispatchers", "paused", "waits"} & set(data["unreadable"])
    assert all(r.startswith("QueryCanceled") for r in data["unreadable"].values()), data["unreadable"]
    assert statement_timeout() == before


@pytest.mark.django_db
def test_most_sections_unreadable_still_render_with_unknowns(operator, redis_conn):
    # No rows written first: this test's transaction would hold the table the second session must lock.
    with table_locked("dispatch_app_jobattempt"), override_settings(DISPATCH={"DASHBOARD_STATEMENT_TIMEOUT": 0.1}):
        responses = [operator.get(url) for url in PAGES[:3]]  # the dashboard's three (the job list is not sectioned)
    assert [r.status_code for r in responses] == [200, 200, 200]
    live = responses[1].content.decode()
    assert "PostgreSQL: jobs by status cannot be read" in live and "PostgreSQL: the per-domain charts cannot" in live
    row = live.split('id="pf-domain-delivery"')[1].split("</tr>")[0]
    assert row.count("–</a>") == 3  # submitted / queued / running: unknown, not 0


@pytest.mark.django_db
def test_dispatchstats_prints_unknowns_and_names_the_unreadable_sections(redis_conn):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    with table_locked("dispatch_app_jobattempt"), override_settings(DISPATCH={"DASHBOARD_STATEMENT_TIMEOUT": 0.1}):
        with table_locked("dispatch_app_dispatcherprocess"):
            call_command("dispatchstats", stdout=out)
    text = out.getvalue()
    assert "ERROR: PostgreSQL: jobs by status cannot be read" in text
    assert "\ndispatchers\n  unreadable" in text and "TOTAL" in text
