"""bench.profile: BENCH_PROFILE_GIL samples the code that runs, not the threads that wait (a real py-spy)."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.profile import Profiler

SPY = Path(sys.executable).with_name("py-spy")

CHILD = """
import threading, time
def spin_here():
    end = time.monotonic() + 60
    while time.monotonic() < end:
        pass
def wait_here():
    threading.Event().wait(60)
threading.Thread(target=spin_here, daemon=True).start()
print("ready", flush=True)
wait_here()
"""


def test_without_a_directory_nothing_is_recorded(monkeypatch):
    monkeypatch.delenv("BENCH_PROFILE_DIR", raising=False)
    with Profiler(1, "anything") as profiler:
        assert profiler.proc is None


@pytest.mark.skipif(not SPY.exists(), reason="py-spy is a bench dependency (requirements/bench.txt)")
def test_gil_sampling_leaves_a_waiting_thread_out(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("BENCH_PROFILE_GIL", "1")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with Profiler(child.pid, "probe") as profiler:
            # The sampling window (py-spy samples 200 times a second), not a wait for an effect.
            threading.Event().wait(2.0)
        assert profiler.proc.returncode is not None
        stacks = profiler.path.read_text()
    finally:
        child.kill()
        child.wait(10)
    assert "spin_here" in stacks
    assert "wait_here" not in stacks
