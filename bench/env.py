"""The benchmark's own PostgreSQL database and Redis db index, and the machine facts.

The bench never touches the dev or test databases: it creates its own database
(default ``productflow_bench``) on the configured server, or uses the one a
``--database-url`` names, migrates it, points this process's Django connection
at it, and drops it at the end unless it was given or ``--keep-db`` is set.
Redis is a separate db index (default 9) of the configured server, or the one a
``--redis-url`` names; only that index is ever flushed (FLUSHDB, never FLUSHALL).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from urllib.parse import quote

from bench.logs import LOG_DIR_ENV

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

TABLES = (
    "dispatch_app_jobevent",
    "dispatch_app_dispatchenvelope",
    "dispatch_app_job",
    "dispatch_app_recoveryround",
)


def _conninfo(sd: dict, dbname: str) -> dict:
    params = {
        "dbname": dbname,
        "user": sd.get("USER") or None,
        "password": sd.get("PASSWORD") or None,
        "host": (sd.get("OPTIONS") or {}).get("host") or sd.get("HOST") or None,
        "port": sd.get("PORT") or None,
        "connect_timeout": 10,
    }
    return {k: v for k, v in params.items() if v is not None}


def _url_for(sd: dict) -> str:
    user = quote(sd.get("USER") or "postgres")
    password = quote(sd.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else f"{user}@"
    socket_dir = (sd.get("OPTIONS") or {}).get("host")
    host = sd.get("HOST") or ""
    port = sd.get("PORT") or ""
    if socket_dir and not host:
        return f"postgresql://{auth}/{sd['NAME']}?host={quote(str(socket_dir))}"
    return f"postgresql://{auth}{host}{':' + str(port) if port else ''}/{sd['NAME']}"


def redis_url_with_db(url: str, db: int) -> str:
    if re.search(r"[?&]db=\d+", url):
        return re.sub(r"([?&])db=\d+", rf"\g<1>db={db}", url)
    if url.startswith("unix://"):
        return url + ("&" if "?" in url else "?") + f"db={db}"
    return re.sub(r"^(rediss?://[^/?]*)(/\d+)?", rf"\g<1>/{db}", url)


class BenchEnv:
    def __init__(
        self,
        *,
        database_url: str | None = None,
        db_name: str = "productflow_bench",
        redis_url: str | None = None,
        redis_db: int = 9,
        keep_db: bool = False,
        log=print,
        log_dir: Path | None = None,
    ):
        self.database_url = database_url
        self.db_name = db_name
        # DISPATCH settings every child process gets (DISPATCH_<KEY>, JSON), for a variant that changes one.
        self.dispatch_env: dict = {}
        self.redis_url_arg = redis_url
        self.redis_db = redis_db
        self.keep_db = keep_db
        self.log = log
        # --keep-logs: where children write their lines (bench.logs); None keeps only a short tail in memory.
        self.log_dir = log_dir
        self.created: list[str] = []
        self.redis_url = ""
        self.settings_dict: dict = {}

    # --- set-up and tear-down ---------------------------------------------
    def setup(self) -> None:
        import dj_database_url
        import psycopg
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connections

        connections.close_all()
        # As in production: no per-query recording (CursorDebugWrapper) in the bench's own process.
        settings.DEBUG = False
        sd = connections["default"].settings_dict
        if self.database_url:
            parsed = dj_database_url.parse(self.database_url)
            for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT"):
                sd[key] = parsed.get(key) or ""
            options = dict(sd.get("OPTIONS") or {})
            options.pop("host", None)
            options.update(parsed.get("OPTIONS") or {})
            sd["OPTIONS"] = options
        else:
            sd["NAME"] = self.db_name
        # Loops keep their connections; the bench's own thread reconnects per phase.
        sd["CONN_MAX_AGE"] = 60
        self.settings_dict = sd
        with psycopg.connect(autocommit=True, **_conninfo(sd, "postgres")) as admin:
            if not self.database_url:
                # Our own database: a run killed before its clean-up left it behind.
                admin.execute(f'DROP DATABASE IF EXISTS "{sd["NAME"]}" WITH (FORCE)')
            exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [sd["NAME"]]).fetchone()
            if not exists:
                admin.execute(f'CREATE DATABASE "{sd["NAME"]}"')
                self.created.append(sd["NAME"])
        call_command("migrate", verbosity=0, interactive=False)

        base = self.redis_url_arg or settings.REDIS_URL
        self.redis_url = base if self.redis_url_arg else redis_url_with_db(base, self.redis_db)
        settings.REDIS_URL = self.redis_url
        for queue in settings.RQ_QUEUES.values():
            queue["URL"] = self.redis_url
        from dispatch_app.rq import publish as publisher

        # A per-process cache keyed by URL (older: by nothing): drop it so the new URL is used.
        getattr(publisher.redis_connection, "cache_clear", lambda: None)()
        self.reset()

    def teardown(self) -> None:
        import psycopg
        from django.db import connections

        try:
            self.redis().flushdb()
        except Exception as exc:  # noqa: BLE001 - cleanup is best effort, reported
            self.log(f"bench: could not flush redis db: {exc}")
        connections.close_all()
        if self.keep_db:
            return
        with psycopg.connect(autocommit=True, **_conninfo(self.settings_dict, "postgres")) as admin:
            for name in reversed(self.created):
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.clear()

    def reset(self) -> None:
        """Empty our tables and our Redis db index between variants."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")
        self.redis().flushdb()

    # --- side databases (peers) -------------------------------------------
    def side_database(self, suffix: str) -> tuple[str, dict]:
        """Create (fresh) a database next to ours; returns its URL and psycopg conninfo."""
        import psycopg

        name = f"{self.settings_dict['NAME']}_{suffix}"
        with psycopg.connect(autocommit=True, **_conninfo(self.settings_dict, "postgres")) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
        if name not in self.created:
            self.created.append(name)
        sd = dict(self.settings_dict, NAME=name)
        return _url_for(sd), _conninfo(sd, name)

    def drop_side_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[-1].split("?", 1)[0]
        with psycopg.connect(autocommit=True, **_conninfo(self.settings_dict, "postgres")) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)

    # --- handles -------------------------------------------------------------
    def redis(self):
        from dispatch_app.rq.publish import redis_connection

        return redis_connection(self.redis_url)

    def conninfo(self) -> dict:
        return _conninfo(self.settings_dict, self.settings_dict["NAME"])

    @contextmanager
    def raw(self, autocommit: bool = True):
        """A psycopg connection of the bench's own (lock holders, samplers)."""
        import psycopg

        with psycopg.connect(autocommit=autocommit, **self.conninfo()) as conn:
            yield conn

    def child_env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_") and k != LOG_DIR_ENV}
        if self.log_dir is not None:
            env[LOG_DIR_ENV] = str(self.log_dir)
        env.update(
            DJANGO_SETTINGS_MODULE="productflow.settings",
            DATABASE_URL=_url_for(self.settings_dict),
            REDIS_URL=self.redis_url,
            PYTHONUNBUFFERED="1",
            CONN_MAX_AGE="60",
            # Production's cursor: DEBUG would record every query of a long-running loop.
            DEBUG="0",
        )
        env.update({f"DISPATCH_{key}": json.dumps(value) for key, value in self.dispatch_env.items()})
        env.update(extra)
        return env

    def describe(self) -> dict:
        sd = self.settings_dict
        where = (sd.get("OPTIONS") or {}).get("host") or f"{sd.get('HOST')}:{sd.get('PORT') or 5432}"
        redis_where = re.sub(r"\?.*$", "", self.redis_url)
        return {"database": f"{sd['NAME']} @ {where}", "redis": redis_where}

    def server_version(self) -> str:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            return cursor.fetchone()[0]

    def redis_version(self) -> str:
        return str(self.redis().info("server").get("redis_version"))


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in (
        "Django",
        "psycopg",
        "rq",
        "redis",
        "hiredis",
        "django-rq",
        "procrastinate",
        "pgqueuer",
        "matplotlib",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict:
    try:
        uptime = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        uptime = ""
    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "load_average": load_average(),
        "uptime": uptime,
    }
