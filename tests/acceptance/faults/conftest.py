"""Fixtures of the fault suite: a Stack per scenario, on shared or private servers.

- ``shared_stack``: the test database and the test Redis database (``subprocess_env``);
  for scenarios that fault no server.
- ``private_redis_stack``: the test database and a private redis-server (stop/restart/flush).
- ``private_stack``: a private PostgreSQL database (cloned from a migrated template)
  and a private redis-server (stop/restart PostgreSQL, terminate backends, flush Redis).
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from tests.acceptance.faults.infra import Stack
from tests.helpers import MANAGE, PYTHON, ROOT
from tests.private_servers import PrivatePostgres, PrivateRedis, make_base_dir, remove_tree

TEMPLATE_DB = "pf_faults_template"


@pytest.fixture(scope="session")
def private_postgres():
    """One private PostgreSQL for the session, with a migrated template database."""
    base = make_base_dir("pf-pg-")
    server = PrivatePostgres(base)
    server.init()
    server.start()
    try:
        import psycopg

        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="productflow.settings",
            DATABASE_URL=server.url(TEMPLATE_DB),
            # migrate never talks to Redis; a URL keeps settings from starting the embedded one.
            REDIS_URL=f"unix://{base}/no-redis.sock?db=0",
        )
        env.pop("PRODUCTFLOW_ENV", None)
        result = subprocess.run(
            [PYTHON, MANAGE, "migrate", "--noinput"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
        )
        assert result.returncode == 0, f"migrate failed:\n{result.stdout}\n{result.stderr}"
        yield server
    finally:
        if server.running():
            try:
                server.stop("immediate")
            except Exception:  # noqa: BLE001 - best effort at session end
                pass
        remove_tree(base)


def fresh_database(server):
    """A fresh, migrated database on the private server (a clone of the template), dropped afterwards."""
    import psycopg

    name = f"pf_faults_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}")
    yield server.url(name)
    if not server.running():
        server.start()
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def private_db(private_postgres):
    yield from fresh_database(private_postgres)


@pytest.fixture
def private_redis():
    base = make_base_dir("pf-redis-")
    server = PrivateRedis(base)
    server.start()
    yield server
    server.stop()
    remove_tree(base)


@pytest.fixture
def fault_tmp():
    base = make_base_dir("pf-run-")
    yield base
    if os.environ.get("PF_FAULTS_KEEP_LOGS"):
        print(f"\nfault logs kept in {base}")
    else:
        remove_tree(base)


def _stack(request, db_url, redis_url, env, tmp):
    stack = Stack(db_url=db_url, redis_url=redis_url, base_env=env, tmp=tmp)
    yield stack
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for proc in stack.procs:
            print(f"\n===== {proc.name} (pid {proc.pid}) =====\n{proc.output()[-6000:]}")
        try:
            print("\n===== database =====")
            print("jobs:", stack.sql("SELECT status, attempt, count(*) FROM dispatch_app_job GROUP BY 1, 2"))
            print(
                "envelopes:",
                stack.sql("SELECT status, send_attempts, count(*) FROM dispatch_app_dispatchenvelope GROUP BY 1, 2"),
            )
            print("events:", stack.sql("SELECT kind, count(*) FROM dispatch_app_jobevent GROUP BY 1"))
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            print("database not readable:", exc)
    stack.close()


@pytest.fixture
def shared_stack(request, transactional_db, subprocess_env, fault_tmp):
    yield from _stack(request, subprocess_env["DATABASE_URL"], subprocess_env["REDIS_URL"], subprocess_env, fault_tmp)


@pytest.fixture
def private_redis_stack(request, transactional_db, subprocess_env, private_redis, fault_tmp):
    yield from _stack(request, subprocess_env["DATABASE_URL"], private_redis.url, subprocess_env, fault_tmp)


@pytest.fixture
def private_stack(request, subprocess_env, private_db, private_redis, fault_tmp):
    yield from _stack(request, private_db, private_redis.url, subprocess_env, fault_tmp)


def pytest_collection_modifyitems(config, items):
    """A scenario on ``private_db`` runs on servers of its own, from the same binaries whatever DATABASE_URL and
    REDIS_URL say: marked ``private_servers``, so a run that only changes where the suite's servers come from (CI's
    embedded-default path) can leave the repeat out."""
    for item in items:
        if "private_db" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.private_servers)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
