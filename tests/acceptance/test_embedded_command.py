"""``manage.py embedded status|stop`` look at the embedded servers without starting them (issue 11 item 7).

Each test points PRODUCTFLOW_EMBEDDED_DIR at a temp folder, with DATABASE_URL and
REDIS_URL unset (the embedded default), so nothing here touches the checkout's
own embedded servers.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest

from tests.helpers import MANAGE, PYTHON, ROOT

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(180),
    # The embedded default is a development convenience with no Python 3.13 wheels (requirements/embedded.txt);
    # CI's Python 3.11 leg runs these, its 3.13 leg has no embedded servers to look at.
    pytest.mark.skipif(importlib.util.find_spec("pgserver") is None, reason="pgserver is not installed (Python 3.13)"),
    pytest.mark.path_dependent,
]


def embedded_env(folder) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "PRODUCTFLOW_ENV")}
    env.update(DJANGO_SETTINGS_MODULE="productflow.settings", PRODUCTFLOW_EMBEDDED_DIR=str(folder))
    return env


def run(env: dict, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [PYTHON, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_status_and_stop_start_nothing(tmp_path):
    env = embedded_env(tmp_path / "embedded")
    status = run(env, MANAGE, "embedded", "status").stdout
    assert "postgres: stopped" in status and "redis:    stopped" in status
    assert run(env, MANAGE, "embedded", "stop").stdout.strip() == "stopped: nothing was running"
    assert not (tmp_path / "embedded" / "pg").exists()  # loading settings did not init a PostgreSQL


def test_status_reports_a_running_server_and_stop_stops_it(tmp_path):
    env = embedded_env(tmp_path / "embedded")
    # Only the Redis is started (the PostgreSQL's initdb would make this test slow); settings start neither.
    url = run(env, "-c", "from productflow import embedded; print(embedded.redis_url())").stdout.strip()
    try:
        status = run(env, MANAGE, "embedded", "status").stdout
        assert f"redis:    running at {url}" in status
        assert "postgres: stopped" in status
        assert not (tmp_path / "embedded" / "pg").exists()
    finally:
        stopped = run(env, MANAGE, "embedded", "stop").stdout
    assert stopped.strip() == "stopped: redis"
    assert "redis:    stopped" in run(env, MANAGE, "embedded", "status").stdout
