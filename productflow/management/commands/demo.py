"""``manage.py demo``: the main job end to end on whatever PostgreSQL/Redis the settings name.

Starts rundispatcher and ``runworkers`` (the project's PipelineWorkers) as real subprocesses, submits demo
traffic with loadgen, waits until every job is finished, stops the processes
and prints the per-stage latency table (database clock).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from dispatch_app.domains.demo_payloads import demo_domain_keys
from dispatch_app.management.commands._args import domain_list, positive_float, positive_int
from dispatch_app.management.commands._migrated import require_migrated
from dispatch_app.rq.worker.launch import default_processes
from dispatch_app.timeline.latency import format_table, stage_latencies
from productflow.management.commands.loadgen import generate, progress_bar

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")


def child_env() -> dict[str, str]:
    """The dispatcher's and workers' environment: DEBUG off unless DEBUG is set explicitly.

    Development settings default to DEBUG on, which wraps every SQL statement in
    Django's debug cursor (formatting and keeping the last 9,000 queries per
    connection): about as much client CPU as the worker's own statements. The
    demo measures the pipeline as it runs in production; ``DEBUG=1 make demo``
    keeps it on.
    """
    env = dict(os.environ)
    env.setdefault("DEBUG", "0")
    return env


def _spawn(args: list[str], log_path: Path) -> subprocess.Popen:
    log = open(log_path, "w")  # noqa: SIM115 - handed to the child for its lifetime
    return subprocess.Popen([sys.executable, MANAGE, *args], stdout=log, stderr=subprocess.STDOUT, env=child_env())


def _stop(processes: list[subprocess.Popen], deadline: float) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + deadline
    for proc in processes:
        try:
            proc.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Command(BaseCommand):
    help = "Run dispatcher + workers (runworkers) + demo traffic, then print per-stage latencies."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=positive_int, default=2000, help="jobs to submit (default 2000)")
        parser.add_argument("--rate", type=positive_float, default=200.0, help="jobs per second (default 200)")
        parser.add_argument("--domains", type=domain_list, help="comma-separated subset of domains (default: all)")
        parser.add_argument(
            "--workers", type=positive_int, help="worker processes (default: two per core, as runworkers)"
        )
        parser.add_argument("--timeout", type=positive_float, default=300.0, help="give up after this many seconds")

    def handle(self, *args, **options):
        require_migrated()  # before any child starts: the children would only die with a traceback
        domains = options["domains"] or demo_domain_keys()
        log_dir = Path(settings.BASE_DIR) / "var" / "demo"
        log_dir.mkdir(parents=True, exist_ok=True)
        workers = options["workers"] or default_processes()
        processes = [_spawn(["rundispatcher", "--no-recovery"], log_dir / "rundispatcher.log")]
        processes.append(_spawn(["runworkers", "--processes", str(workers)], log_dir / "runworkers.log"))
        self.stdout.write(f"started rundispatcher and runworkers ({workers} worker process(es)); logs in {log_dir}")
        try:
            self._wait_ready(processes, workers, log_dir / "rundispatcher.log")
            started = time.monotonic()
            first, last = generate(options["count"], domains, options["rate"], progress_bar(sys.stderr))
            self._wait_finished(first, last, processes, started + options["timeout"])
            elapsed = time.monotonic() - started
        finally:
            _stop(processes, deadline=15)

        self.stdout.write("")
        self.stdout.write(
            f"{options['count']} jobs over {', '.join(domains)} in {elapsed:.1f}s (submitted at {options['rate']:g}/s)"
        )
        self.stdout.write(self._outcomes(first, last))
        self.stdout.write(format_table(stage_latencies(first, last)))

    def _wait_ready(self, processes, workers: int, dispatcher_log: Path, timeout: float = 60.0) -> None:
        """Traffic starts once the dispatcher listens and the workers are registered."""
        from rq import Worker

        from dispatch_app.rq.publish import redis_connection

        deadline = time.monotonic() + timeout
        while True:
            ready = "started:" in dispatcher_log.read_text() and Worker.count(connection=redis_connection()) >= workers
            if ready:
                return
            dead = [" ".join(p.args[2:3]) for p in processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise CommandError(f"processes not ready ({', '.join(dead) or 'timeout'}); see var/demo/*.log")
            time.sleep(0.1)  # waiting for other processes to boot

    def _wait_finished(self, first: int, last: int, processes, deadline: float) -> None:
        total = last - first + 1
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM dispatch_app_job WHERE id BETWEEN %s AND %s AND finished_at IS NOT NULL",
                    [first, last],
                )
                done = cursor.fetchone()[0]
            sys.stderr.write(f"\r{done}/{total} jobs finished")
            sys.stderr.flush()
            if done >= total:
                sys.stderr.write("\n")
                return
            dead = [p.args[2] for p in processes if p.poll() is not None]
            if dead:
                raise CommandError(f"{', '.join(dead)} exited early; see var/demo/*.log")
            if time.monotonic() > deadline:
                raise CommandError(f"only {done}/{total} jobs finished before the timeout; see var/demo/*.log")
            time.sleep(0.2)  # polling another process's progress for the operator

    @staticmethod
    def _outcomes(first: int, last: int) -> str:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT status, count(*) FROM dispatch_app_job WHERE id BETWEEN %s AND %s GROUP BY status ORDER BY 1",
                [first, last],
            )
            return "outcomes: " + ", ".join(f"{status} {n}" for status, n in cursor.fetchall())
