"""The worker processes the scenarios compare: RQ's SimpleWorker and the project's worker.

- ``simple``: W ``manage.py plain_rqworker --worker-class rq.worker.SimpleWorker`` processes
  (JSON serializer), what the README ran before the project had its own worker: django-rq's own
  ``rqworker``, which the project's ``rqworker`` no longer hands its queues to
  (``productflow/management/commands/plain_rqworker.py``, in this repository only).
- ``pipeline``: ``manage.py runworkers --processes W``, the project's worker
  (``dispatch_app.rq.worker.PipelineWorker``); recorded as not available until it exists.

Each starts idle and counts as ready once all W have registered in RQ's worker set.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import tempfile

from bench.env import PYTHON, ROOT
from bench.load import wait_until
from bench.logs import open_log

SIMPLE = ["--worker-class", "rq.worker.SimpleWorker", "--serializer", "rq.serializers.JSONSerializer"]


class Unavailable(RuntimeError):
    """A variant this checkout cannot run (recorded as such, not as a failure)."""


def pipeline_available() -> bool:
    return (
        importlib.util.find_spec("dispatch_app.rq.worker") is not None
        and (ROOT / "dispatch_app" / "management" / "commands" / "runworkers.py").exists()
    )


class Workers:
    def __init__(
        self,
        env,
        kind: str,
        queues: list[str],
        processes: int = 1,
        *,
        extra_env: dict | None = None,
        run_stamps: str | None = None,
        args: tuple[str, ...] = (),
    ):
        """``run_stamps``: a file the workers append a line to as each job's work begins: the fault suite's
        ledger ("domain job attempt pid time", tests/acceptance/faults/site/sitecustomize.py). ``args``: more of
        runworkers' options (``pipeline`` only)."""
        if kind == "pipeline" and not pipeline_available():
            raise Unavailable("not available: dispatch_app.rq.worker / manage.py runworkers are not in this checkout")
        if kind not in ("simple", "pipeline"):
            raise ValueError(f"unknown worker kind {kind!r}")
        self.env = env
        self.kind = kind
        redis = env.redis()
        before = redis.scard("rq:workers")
        child_env = env.child_env(DISPATCH_PROVIDER_LATENCY_MS="0", **(extra_env or {}))
        if run_stamps:
            site = ROOT / "tests" / "acceptance" / "faults" / "site"
            paths = [str(site), str(ROOT), child_env.get("PYTHONPATH", "")]
            child_env.update(PF_FAULTS_LEDGER=run_stamps, PYTHONPATH=os.pathsep.join(p for p in paths if p))
        commands = (
            [["manage.py", "runworkers", "--queues", ",".join(queues), "--processes", str(processes), *args]]
            if kind == "pipeline"
            else [["manage.py", "plain_rqworker", *queues, *SIMPLE] for _ in range(processes)]
        )
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        for command in commands:
            # A file, not a pipe: a full pipe would stall the worker (RQ can log a line per job).
            # Kept under --keep-logs (opened before the process, so named without its pid), a temporary file otherwise.
            log = open_log(child_env, f"{kind}-workers", binary=True)
            log = log or tempfile.TemporaryFile()
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen([PYTHON, *command], cwd=str(ROOT), env=child_env, stdout=log, stderr=subprocess.STDOUT)
            )
        ok = wait_until(
            lambda: redis.scard("rq:workers") >= before + processes or any(p.poll() is not None for p in self.procs),
            timeout=90,
            interval=0.05,
        )
        if not ok or any(p.poll() is not None for p in self.procs):
            tail = self.output()[-1500:]
            self.stop()
            raise RuntimeError(f"{kind} workers did not register: {tail}")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def output(self) -> str:
        text = []
        for log in self.logs:
            try:
                log.seek(0)
                text.append(log.read().decode(errors="replace"))
            except ValueError:
                pass
        return "\n".join(text)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for log in self.logs:
            log.close()
        self.logs = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
