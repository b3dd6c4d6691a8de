"""Shared fixtures: real PostgreSQL (pytest-django's test database) and real Redis."""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from tests.helpers import database_url_for_subprocess

# Property tests (issue 26): moderate in CI; HYPOTHESIS_PROFILE=thorough for the 10k-example run.
_PROPERTY = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
hypothesis_settings.register_profile("ci", max_examples=150, **_PROPERTY)
hypothesis_settings.register_profile("thorough", max_examples=10_000, **_PROPERTY)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def redis_conn():
    """The test Redis database, empty at the start and the end of the test."""
    from dispatch_app.rq.publish import redis_connection

    conn = redis_connection(settings.REDIS_URL)
    pool = conn.connection_pool
    kwargs = dict(pool.connection_kwargs)
    conn.flushdb()
    yield conn
    conn.flushdb()
    if pool.connection_kwargs != kwargs:
        # RQ's Worker raises its connection's socket_timeout to its dequeue timeout (415 s), and this pool is the
        # process's shared one: a SimpleWorker run in a test would leave every later test's sends unbounded.
        pool.connection_kwargs.clear()
        pool.connection_kwargs.update(kwargs)
        pool.disconnect()


@pytest.fixture
def subprocess_env(redis_conn):
    """Environment for a child process (rundispatcher, rqworker) that sees the test database and Redis."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="productflow.settings",
        DATABASE_URL=database_url_for_subprocess(),
        REDIS_URL=settings.REDIS_URL,
        PYTHONUNBUFFERED="1",
    )
    return env
