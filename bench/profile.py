"""Optional py-spy profiles of the processes a scenario measures (``BENCH_PROFILE_DIR=dir dispatchbench ...``).

``Profiler(pid, name)`` attaches ``py-spy record`` to a running process for the
measured window only (not its start-up) and writes collapsed stacks
(``--format raw``, idle samples left out) to ``<dir>/<name>-<pid>.txt``; SIGINT
ends the recording and makes py-spy write the file. Without the variable, or
without py-spy, it does nothing, so a normal run is never slowed by sampling.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path


class Profiler:
    def __init__(self, pid: int, name: str, *, subprocesses: bool = False):
        self.proc = None
        where = os.environ.get("BENCH_PROFILE_DIR")
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not where or not Path(spy).exists():
            return
        Path(where).mkdir(parents=True, exist_ok=True)
        self.path = Path(where) / f"{name}-{pid}.txt"
        args = [spy, "record", "-p", str(pid), "--format", "raw", "-r", "200", "-o", str(self.path)]
        if subprocesses:
            args.append("--subprocesses")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
