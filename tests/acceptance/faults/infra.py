"""The fault suite's machinery: child processes, the submitter, the execution ledger.

The private servers a scenario stops, restarts or flushes are in ``tests.private_servers``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.helpers import MANAGE, PYTHON, ROOT, wait_until

SITE_DIR = Path(__file__).resolve().parent / "site"
FIGURES_DIR = ROOT / "var" / "fault-figures"
# The project's worker command: PipelineWorker and the JSON serializer always; one process per Proc.
WORKER_ARGS = ("--processes", "1")


# --- child processes ---------------------------------------------------------
class Proc:
    """One child process (rundispatcher, rqworker, ...), its output in a file."""

    def __init__(self, name: str, args: list[str], env: dict, log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.pid = self.popen.pid
        # Until the test stops, signals or waits for it, an exit is a failure worth reporting at once.
        self.expected_alive = True

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: int) -> None:
        self.expected_alive = False
        if self.alive():
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        self.expected_alive = False
        return self.popen.wait(timeout=timeout)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM, then SIGKILL after the timeout; returns the exit code."""
        self.send(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(timeout=10)

    def cpu_seconds(self) -> float:
        import psutil

        times = psutil.Process(self.pid).cpu_times()
        return times.user + times.system

    def close(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait(timeout=10)
        self._log.close()


class Submitter:
    """A long-lived child process that submits through the real outbox API (``submit_many``)."""

    def __init__(self, env: dict, log_dir: Path):
        self.popen = subprocess.Popen(
            [PYTHON, "-m", "tests.acceptance.faults.submitter"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(log_dir / "submitter.log", "ab"),
            text=True,
            start_new_session=True,
        )

    def call(self, **request) -> dict:
        self.popen.stdin.write(json.dumps(request) + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"submitter died (exit {self.popen.poll()}); see submitter.log")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"submitter: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.stdin.close()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


@dataclass
class Stack:
    """One scenario's world: a database URL, a Redis URL, the child processes started against them."""

    db_url: str
    redis_url: str
    base_env: dict
    tmp: Path
    procs: list[Proc] = field(default_factory=list)
    _submitter: Submitter | None = None
    _counter: int = 0

    @property
    def ledger_path(self) -> Path:
        return self.tmp / "executions.ledger"

    def env(self, **extra) -> dict:
        env = dict(self.base_env)
        env.update(
            DATABASE_URL=self.db_url,
            REDIS_URL=self.redis_url,
            PYTHONPATH=os.pathsep.join([str(SITE_DIR), str(ROOT)]),
            PF_FAULTS_LEDGER=str(self.ledger_path),
            MEDIA_ROOT=str(self.tmp / "media"),
            LOG_LEVEL="INFO",
        )
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def spawn(self, name: str, args: list[str], **env) -> Proc:
        self._counter += 1
        proc = Proc(f"{self._counter:02d}-{name}", args, self.env(**env), self.tmp)
        self.procs.append(proc)
        return proc

    def dispatcher(self, *args: str, name: str = "dispatcher", recovery: bool = False, **env) -> Proc:
        argv = [PYTHON, MANAGE, "rundispatcher", *args]
        if not recovery:
            argv.append("--no-recovery")
        return self.spawn(name, argv, **env)

    def worker(self, *queues: str, name: str = "worker", burst: bool = False, **env) -> Proc:
        argv = [PYTHON, MANAGE, "runworkers", "--queues", ",".join(queues or ("delivery",)), *WORKER_ARGS]
        if burst:
            argv.append("--burst")
        return self.spawn(name, argv, **env)

    def manage(self, *args: str, timeout: float = 120, **env) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, MANAGE, *args], cwd=ROOT, env=self.env(**env), capture_output=True, text=True, timeout=timeout
        )

    def submit(
        self,
        count: int,
        *,
        domain: str = "delivery",
        prefix: str = "job",
        delay: float | None = None,
        payloads: list[dict] | None = None,
    ):
        """Submit ``count`` jobs (or one per given payload) through ``submit_many`` in a child process; their ids."""
        if self._submitter is None:
            self._submitter = Submitter(self.env(), self.tmp)
        reply = self._submitter.call(count=count, domain=domain, prefix=prefix, delay=delay, payloads=payloads)
        return reply["ids"]

    def close_submitter(self) -> None:
        if self._submitter is not None:
            self._submitter.close()
            self._submitter = None

    # --- looking -------------------------------------------------------------
    def connect(self, **kwargs) -> psycopg.Connection:
        return psycopg.connect(self.db_url, autocommit=True, connect_timeout=10, **kwargs)

    def sql(self, query: str, params=()) -> list[tuple]:
        with self.connect() as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def scalar(self, query: str, params=()):
        rows = self.sql(query, params)
        return rows[0][0] if rows else None

    def rq_job_id(self, job_id: int, attempt: int) -> str:
        """The RQ id this stack's processes give an attempt (their namespace is their database's)."""
        from dispatch_app.rq.deployment import IDENTITY_SQL, derived
        from dispatch_app.rq.ids import rq_job_id

        return rq_job_id(job_id, attempt, ns=derived(*self.sql(IDENTITY_SQL)[0]))

    def count_envelopes(self, status: str) -> int:
        return self.scalar("SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE status = %s", [status])

    def count_jobs(self, status: str) -> int:
        return self.scalar("SELECT count(*) FROM dispatch_app_job WHERE status = %s", [status])

    def wait_all(self, status: str, expected: int, timeout: float, what: str = "jobs") -> float:
        """Bounded poll until ``expected`` jobs (or envelopes) have ``status``; returns seconds waited."""
        started = time.monotonic()
        counter = self.count_jobs if what == "jobs" else self.count_envelopes

        def done() -> bool:
            self.check_alive()
            return counter(status) >= expected

        wait_until(
            done,
            timeout=timeout,
            interval=0.1,
            message=f"{expected} {what} {status} (have {counter(status)})",
        )
        return time.monotonic() - started

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.expected_alive and not proc.alive():
                raise AssertionError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.output()[-4000:]}")

    def ledger(self) -> Counter:
        return read_ledger(self.ledger_path)

    def close(self) -> None:
        self.close_submitter()
        for proc in reversed(self.procs):
            proc.close()


def read_ledger(path: Path) -> Counter:
    """(job id, attempt) -> how many times the work ran."""
    counts: Counter = Counter()
    if not path.exists():
        return counts
    for line in path.read_text().splitlines():
        _domain, job_id, attempt, _pid, _at = line.split()
        counts[(int(job_id), int(attempt))] += 1
    return counts


def record_figures(scenario: str, **figures) -> None:
    """Figures for docs/reliability.md, one JSON file per scenario (var/ is git-ignored)."""
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    figures["recorded_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (FIGURES_DIR / f"{scenario}.json").write_text(json.dumps(figures, indent=2, default=str))
    print(f"\nFIGURES {scenario}: {json.dumps(figures, default=str)}")
