"""Child-process wrapper for the vendor scenarios: ``python -m tests.acceptance.faults.gated_vendor <manage args>``.

Runs a ``manage.py`` command (plain_rqworker, recover) with the local provider held at
gates the test opens by creating files in ``PF_GATE_DIR``, so a scenario can
place a worker inside a vendor call, or recovery inside a vendor status call,
and know it is there:

PF_GATE_VENDOR=1        each image/edit call, once its request is recorded "pending" at the vendor, writes
                        ``vendor-entered`` and waits for ``vendor-release`` (at most 60 s)
PF_GATE_STEPS=1         each workflow/agent step (run_step, no vendor record) writes ``vendor-entered`` (its
                        request id) and waits for ``vendor-release`` (at most 60 s)
PF_GATE_STATUS=<s>      each status call writes ``status-entered`` and takes ``<s>`` seconds, or less if the
                        test creates ``status-release``, to return the vendor's answer as of the question
                        (a slow vendor status endpoint)

Only the local provider (the vendors' stand-in) is changed; everything else is the real command.
"""

import os
import sys
import time
from pathlib import Path

# A plain RQ worker running jobs in its own process (so the gates above apply to them): django-rq's own rqworker,
# which the project's rqworker refuses its queues to (productflow/management/commands/plain_rqworker.py).
RQWORKER_ARGS = ("--serializer", "rq.serializers.JSONSerializer", "--worker-class", "rq.worker.SimpleWorker")


def _wait_for(path: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def install() -> None:
    from dispatch_app.domains.providers import LocalProvider

    gates = Path(os.environ["PF_GATE_DIR"])
    if os.environ.get("PF_GATE_VENDOR"):
        real_call = LocalProvider._call

        def gated_call(self, op, request_id, record=True):
            if request_id and record:
                self._record(request_id, "pending")
                (gates / "vendor-entered").write_text(request_id)
                _wait_for(gates / "vendor-release", 60)
            return real_call(self, op, request_id, record)

        LocalProvider._call = gated_call
    if os.environ.get("PF_GATE_STEPS"):
        real_step = LocalProvider.run_step

        def gated_step(self, name, context, request_id=None):
            (gates / "vendor-entered").write_text(request_id or "-")
            _wait_for(gates / "vendor-release", 60)
            return real_step(self, name, context, request_id)

        LocalProvider.run_step = gated_step
    status_seconds = float(os.environ.get("PF_GATE_STATUS") or 0)
    if status_seconds:
        real_status = LocalProvider.request_status

        def slow_status(self, request_id):
            answer = real_status(self, request_id)  # the vendor's answer as of the question; it arrives late
            (gates / "status-entered").write_text(request_id)
            _wait_for(gates / "status-release", status_seconds)
            return answer

        LocalProvider.request_status = slow_status


def main() -> None:
    import django

    django.setup()
    install()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
