"""Producer and peer processes with the ready / go / stop protocol on stdin and stdout.

``Proc([...module, role...], env)`` starts ``python -m ...``, waits for ``ready``;
``go()`` / ``stop()`` write a word; ``result()`` waits for the ``result <json>`` line.
``one_shot`` runs a role to completion and returns its result.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading

from bench.env import PYTHON, ROOT
from bench.logs import drain, open_log


def _role(args: list[str]) -> str:
    """``bench.peer_procrastinate worker {...}`` -> ``peer_procrastinate-worker``: a log file's name."""
    words = [args[0].rsplit(".", 1)[-1], *(a for a in args[1:2] if a.isidentifier())]
    return "-".join(words)


class Proc:
    def __init__(self, args: list[str], env: dict, *, ready_timeout: float = 60.0):
        self.proc = subprocess.Popen(
            [PYTHON, "-m", *args],
            cwd=str(ROOT),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._log = open_log(env, _role(args), self.proc.pid)
        self._stderr: list[str] = []
        threading.Thread(target=drain, args=(self.proc.stderr, self._stderr, self._log), daemon=True).start()
        self._results: queue.Queue = queue.Queue()
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(ready_timeout):
            self.kill()
            raise RuntimeError(f"{args[0]} did not start: {self.stderr[-2000:]}")

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line == "ready":
                self._ready.set()
            elif line.startswith("result "):
                self._results.put(line[7:])
        # EOF: whatever was (not) said, stop waiting.
        self._ready.set()
        self._results.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def send(self, word: str) -> None:
        try:
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def go(self, **overrides) -> None:
        self.send("go " + json.dumps(overrides))

    def result(self, timeout: float) -> dict:
        """The next ``result`` line."""
        try:
            line = self._results.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None:
            self.kill()
            raise RuntimeError(f"no result within {timeout:.0f} s: {self.stderr[-2000:]}")
        return json.loads(line)

    def run(self, timeout: float, **overrides) -> dict:
        self.go(**overrides)
        return self.result(timeout)

    def stop(self, timeout: float = 30.0, *, expect_result: bool = False) -> dict | None:
        self.send("stop")
        out = self.result(timeout) if expect_result else None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def one_shot(args: list[str], env: dict, timeout: float) -> dict:
    proc = subprocess.run(
        [PYTHON, "-m", *args], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout
    )
    for line in proc.stdout.splitlines():
        if line.startswith("result "):
            return json.loads(line[7:])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise RuntimeError(f"{args[0]} {args[1] if len(args) > 1 else ''} exited {proc.returncode}: {' | '.join(tail)}")
