"""``rundispatcher`` and a plain RQ worker (``plain_rqworker``) as real processes against the test database and Redis.

Submitted (committed) jobs are started and succeed; SIGTERM stops the dispatcher with
exit 0 within its deadline; a second signal exits at once even while a send hangs.
"""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import threading
import time

import pytest

from dispatch_app import submit_many
from dispatch_app.domains import lane_queue_names
from dispatch_app.models import Job, JobStatus
from tests.factories import PAYLOADS
from tests.helpers import MANAGE, PYTHON, ROOT, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

DEADLINE = 5.0


class Process:
    """A child process whose output lines are collected as they come (no blocking reads in the test)."""

    def __init__(self, args: list[str], env: dict):
        self.proc = subprocess.Popen(
            [PYTHON, MANAGE, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.put(line)

    def wait_for_line(self, text: str, timeout: float = 30.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout}s; output so far:\n{''.join(self.seen)}")

    def output(self) -> str:
        while not self.lines.empty():
            self.seen.append(self.lines.get_nowait())
        return "".join(self.seen)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def processes():
    started: list[Process] = []

    def start(args: list[str], env: dict) -> Process:
        process = Process(args, env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def dispatcher_args(*extra: str) -> list[str]:
    # Recovery has its own tests; the fallback tick is far away, so new work arrives by NOTIFY.
    return ["rundispatcher", "--no-recovery", "--poll-interval", "60", *extra]


def worker_args() -> list[str]:
    return [
        "plain_rqworker",
        *lane_queue_names(),
        "--serializer",
        "rq.serializers.JSONSerializer",
        "--worker-class",
        "rq.worker.SimpleWorker",
    ]


def jobs_of_every_domain() -> list[Job]:
    return submit_many([(domain, payload) for domain, payload in sorted(PAYLOADS.items())])


def test_submitted_jobs_are_started_and_succeed_then_sigterm_exits_0_within_the_deadline(
    subprocess_env, processes, tmp_path
):
    env = dict(subprocess_env, MEDIA_ROOT=str(tmp_path))
    before = jobs_of_every_domain()  # found by the catch-up scan after LISTEN
    dispatcher = processes(dispatcher_args("--shutdown-deadline", str(DEADLINE)), env)
    dispatcher.wait_for_line("rundispatcher pid")
    worker = processes(worker_args(), env)
    after = jobs_of_every_domain()  # announced by NOTIFY on commit
    ids = [job.pk for job in before + after]

    wait_until(
        lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids),
        timeout=60,
        message=f"all {len(ids)} jobs to succeed; statuses: "
        f"{list(Job.objects.filter(pk__in=ids).values_list('status', flat=True))}",
    )
    for job in Job.objects.filter(pk__in=ids):
        assert job.submitted_at <= job.dispatched_at <= job.started_at <= job.finished_at, job
        assert job.attempt == 1

    started = time.monotonic()
    dispatcher.signal(signal.SIGTERM)
    assert dispatcher.proc.wait(DEADLINE + 10) == 0, dispatcher.output()
    assert time.monotonic() - started < DEADLINE + 5
    assert "did not stop" not in dispatcher.output()
    assert "Fatal Python error" not in dispatcher.output()  # no thread wrote during interpreter shutdown
    assert "start-up objects frozen" in dispatcher.output()  # runtime.gcfreeze, before the loops started

    worker.signal(signal.SIGTERM)
    worker.proc.wait(30)


@pytest.fixture
def blackhole():
    """A "Redis" that accepts connections and never answers: a send to it hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(30)
    yield server
    server.close()


def accept_the_send(blackhole) -> socket.socket:
    """The dispatcher's send's connection: the first one is its start-up check that no other deployment uses this
    Redis (dispatch_app.rq.deployment), which gives up after its own short timeout and lets the process start."""
    check, _ = blackhole.accept()
    held, _ = blackhole.accept()
    check.close()
    return held


def hanging_env(subprocess_env, blackhole) -> dict:
    port = blackhole.getsockname()[1]
    # The lease must outlast a send that may wait out those timeouts (conf.check_lease), or start-up refuses it.
    return dict(
        subprocess_env,
        REDIS_URL=f"redis://127.0.0.1:{port}/0",
        REDIS_SOCKET_TIMEOUT="120",
        DISPATCH_LEASE_SECONDS="1000",
    )


def test_a_second_signal_exits_at_once_while_a_send_hangs(subprocess_env, processes, blackhole):
    jobs_of_every_domain()
    dispatcher = processes(dispatcher_args("--shutdown-deadline", "120"), hanging_env(subprocess_env, blackhole))
    held = accept_the_send(blackhole)  # the send is in flight now
    dispatcher.wait_for_line("rundispatcher pid")
    dispatcher.signal(signal.SIGTERM)
    dispatcher.wait_for_line("stopping")  # handled: the clean stop now waits for the send
    started = time.monotonic()
    dispatcher.signal(signal.SIGTERM)
    assert dispatcher.proc.wait(10) == 1, dispatcher.output()
    assert time.monotonic() - started < 10
    held.close()


def test_a_loop_stuck_past_the_deadline_is_named_and_the_process_still_exits(subprocess_env, processes, blackhole):
    jobs_of_every_domain()
    dispatcher = processes(dispatcher_args("--shutdown-deadline", "1"), hanging_env(subprocess_env, blackhole))
    held = accept_the_send(blackhole)
    dispatcher.wait_for_line("rundispatcher pid")
    started = time.monotonic()
    dispatcher.signal(signal.SIGTERM)
    dispatcher.wait_for_line("loop dispatch did not stop within 1.0s", timeout=10)
    assert dispatcher.proc.wait(10) == 3, dispatcher.output()  # not a clean stop: exit code 3
    assert time.monotonic() - started < 10
    held.close()
