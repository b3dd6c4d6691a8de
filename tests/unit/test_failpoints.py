"""Failpoints: inert unless named in PRODUCTFLOW_FAILPOINTS; kill_* really kills the process."""

import signal
import subprocess

import pytest

from dispatch_app import failpoints
from tests.helpers import PYTHON, ROOT


def test_an_inactive_failpoint_does_nothing():
    assert "never_set" not in failpoints.ACTIVE
    failpoints.hit("never_set")


def test_an_active_failpoint_raises(monkeypatch):
    monkeypatch.setattr(failpoints, "ACTIVE", frozenset({"boom"}))
    with pytest.raises(RuntimeError, match="failpoint boom"):
        failpoints.hit("boom")


def test_a_kill_failpoint_sigkills_the_process_named_in_the_environment():
    code = "from dispatch_app import failpoints; failpoints.hit('kill_here'); print('survived')"
    done = subprocess.run(
        [PYTHON, "-c", code],
        cwd=ROOT,
        env={"PRODUCTFLOW_FAILPOINTS": "other,kill_here", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "survived" not in done.stdout
