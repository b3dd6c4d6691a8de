"""Optional py-spy profiles of the processes a scenario measures (``BENCH_PROFILE_DIR=dir dispatchbench ...``).

``Profiler(pid, name)`` attaches ``py-spy record`` to a running process for the
measured window only (not its start-up) and writes collapsed stacks
(``--format raw``) to ``<dir>/<name>-<pid>.txt``; SIGINT ends the recording and
makes py-spy write the file. Without the variable, or without py-spy, it does
nothing, so a normal run is never slowed by sampling.

py-spy leaves idle threads out only where it can tell a blocked thread from a running one; in some containers
(this project's machines) it cannot, and a thread waiting on a lock or a socket is sampled as if it ran: the
profile is then wall-clock. ``BENCH_PROFILE_GIL=1`` samples only the thread holding the GIL (``--gil``): the
CPU of the Python code, without its waits (C code that releases the GIL, such as a socket read, is not seen).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path


def record_args(spy: str, pid: int, path: Path, *, subprocesses: bool = False, gil: bool = False) -> list[str]:
    """The ``py-spy record`` command line: 200 samples a second of ``pid``, collapsed stacks to ``path``."""
    args = [spy, "record", "-p", str(pid), "--format", "raw", "-r", "200", "-o", str(path)]
    if subprocesses:
        args.append("--subprocesses")
    if gil:
        args.append("--gil")
    return args


class Profiler:
    def __init__(self, pid: int, name: str, *, subprocesses: bool = False):
        self.proc = None
        where = os.environ.get("BENCH_PROFILE_DIR")
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not where or not Path(spy).exists():
            return
        Path(where).mkdir(parents=True, exist_ok=True)
        self.path = Path(where) / f"{name}-{pid}.txt"
        args = record_args(
            spy, pid, self.path, subprocesses=subprocesses, gil=bool(os.environ.get("BENCH_PROFILE_GIL"))
        )
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
