"""LEASE_SECONDS must outlast the worst case of a batch's sends; rundispatcher refuses one that does not (exit 2)."""

import os
import subprocess

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from dispatch_app.config.settings import check_lease, validate
from dispatch_app.rq.publish import Publisher
from tests.helpers import MANAGE, PYTHON, ROOT


def conf(**raw):
    return validate(raw)


def test_the_worst_case_is_timeouts_times_attempts_times_waves():
    # 100 / 10 = 10 chunks, 4 at a time: 3 waves of 2 s x 2 attempts + 1 s backoff.
    settings = conf(BATCH_SIZE=100, SEND_CHUNK_SIZE=10, SEND_CONCURRENCY=4, LEASE_SECONDS=100)
    worst = check_lease(settings, socket_timeout=2, attempts=2, retry_wait=1)
    assert worst == 3 * (2 * 2 + 1)
    # The defaults (batch 100 in chunks of 50, 4 at a time) with 5 s timeouts, and a batch of 500: room in 30 s.
    assert check_lease(conf(), socket_timeout=5) == 5
    assert check_lease(conf(BATCH_SIZE=500), socket_timeout=5) == 15


def test_a_lease_that_does_not_outlast_a_send_names_both_settings():
    settings = conf(LEASE_SECONDS=10, SEND_CONCURRENCY=1)
    with pytest.raises(ImproperlyConfigured) as error:
        check_lease(settings, socket_timeout=5)
    message = str(error.value)
    assert "DISPATCH['LEASE_SECONDS'] = 10s" in message and "10s: REDIS_SOCKET_TIMEOUT 5s" in message
    assert "REDIS_SOCKET_TIMEOUT" in message and "SEND_CONCURRENCY" in message


def test_no_socket_timeout_outlasts_every_lease():
    with pytest.raises(ImproperlyConfigured, match="no timeout"):
        check_lease(conf(), socket_timeout=None)


def test_the_limits_are_read_from_the_redis_url_the_sends_use():
    client = redis.Redis.from_url("redis://127.0.0.1:1/0?socket_timeout=0.5&health_check_interval=30")
    limits = Publisher(conf(), client).send_limits()  # nothing connects
    assert limits == {"socket_timeout": 0.5, "attempts": 1, "retry_wait": 0.0}


def test_rundispatcher_exits_2_on_a_lease_shorter_than_a_send():
    env = dict(os.environ, REDIS_URL="redis://127.0.0.1:1/0", REDIS_SOCKET_TIMEOUT="5")
    done = subprocess.run(
        [PYTHON, MANAGE, "rundispatcher", "--lease", "5", "--no-recovery", "--batch-size", "500"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "DISPATCH['LEASE_SECONDS'] = 5s does not outlast" in done.stderr
    assert "REDIS_SOCKET_TIMEOUT" in done.stderr
