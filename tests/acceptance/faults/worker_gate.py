"""Child-process wrapper: ``python -m tests.acceptance.faults.worker_gate <manage args>`` (runworkers).

The command runs unchanged except that the local provider's ``deliver`` is held
at a gate, so a test knows a worker is inside a job and keeps it there:

PF_WORKER_GATE=<dir>   each deliver writes ``<dir>/entered-<pid>-<n>`` and waits for ``<dir>/release``
                       (at most 60 s), then delivers as usual
"""

import os
import sys
import time
from pathlib import Path


def install() -> None:
    from dispatch_app.domains.providers import LocalProvider

    gate = Path(os.environ["PF_WORKER_GATE"])
    real = LocalProvider.deliver
    calls = {"n": 0}

    def gated(self, *args, **kwargs):
        calls["n"] += 1
        (gate / f"entered-{os.getpid()}-{calls['n']}").write_text("")
        deadline = time.monotonic() + 60
        while not (gate / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # polling a file the test creates: the gate itself
        return real(self, *args, **kwargs)

    LocalProvider.deliver = gated


def main() -> None:
    import django

    django.setup()
    install()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
