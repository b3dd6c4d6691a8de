"""The default deployment: ``rundispatcher`` runs recovery in a supervised child process at a lower CPU priority.

Real processes against the test database and Redis: the child is niced, a child
killed with -9 is restarted and its death is on the parent's heartbeat rows (the
dashboard), SIGTERM stops both within the deadline, the child does not outlive a
parent killed with -9, and a loop hung past the deadline is exit code 3.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from dispatch_app.models import DispatcherProcess, LoopHeartbeat
from tests.acceptance import test_rundispatcher as shared
from tests.acceptance.test_rundispatcher import Process, hanging_env
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

DEADLINE = 5.0
SAFETY = 60.0
# The fixtures of the rundispatcher tests (real processes, a Redis that never answers).
processes = shared.processes
blackhole = shared.blackhole
CHILD_LINE = re.compile(r"recovery process pid (\d+) \(nice (-?\d+)\) started")


def child_pid(process: Process, after: int | None = None) -> int:
    """The pid of the next recovery child the parent starts (the child prints it when it runs)."""
    while True:
        line = process.wait_for_line("recovery process pid", timeout=SAFETY)
        pid = int(CHILD_LINE.search(line).group(1))
        if pid != after:
            return pid


def nice_values(pid: int) -> set[int]:
    """The nice value of every thread of a process (Linux: niceness is per thread)."""
    values = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as stat:
            # Field 19 is nice; the command name (field 2) may hold spaces, so split after its ')'.
            values.add(int(stat.read().rsplit(")", 1)[1].split()[16]))
    return values


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def fast_env(subprocess_env) -> dict:
    return dict(
        subprocess_env,
        DISPATCH_HEARTBEAT_INTERVAL="0.2",
        DISPATCH_RECOVERY=json.dumps({"delivery": {"PERIOD_SECONDS": 0.2, "JITTER_SECONDS": 0}}),
    )


def heartbeat(parent_pid: int, loop: str) -> LoopHeartbeat | None:
    return LoopHeartbeat.objects.filter(process__pid=parent_pid, process__stopped_at=None, loop=loop).first()


def test_the_child_runs_niced_is_restarted_after_kill_9_and_sigterm_stops_both(subprocess_env, processes):
    parent = processes(
        ["rundispatcher", "--domains", "delivery,agent", "--shutdown-deadline", str(DEADLINE)], fast_env(subprocess_env)
    )
    parent.wait_for_line("rundispatcher pid")
    first = child_pid(parent)
    assert parent_of(first) == parent.proc.pid
    # Niced before its first thread: every thread of the child runs at the lower priority.
    parent_nice = max(nice_values(parent.proc.pid))
    assert nice_values(first) == {min(parent_nice + 10, 19)}
    assert parent_nice < 19, "the test needs room to be nicer than the parent"

    # The child's loop ticks land on the parent's heartbeat rows, as the threads' did.
    wait_until(
        lambda: (h := heartbeat(parent.proc.pid, "recovery-delivery")) and h.last_tick_at,
        SAFETY,
        message="a recovery-delivery tick reported by the child",
    )

    os.kill(first, signal.SIGKILL)
    second = child_pid(parent, after=first)
    assert second != first and parent_of(second) == parent.proc.pid
    row = wait_until(
        lambda: (h := heartbeat(parent.proc.pid, "recovery-process")) and h.errors >= 1 and h,
        SAFETY,
        message="the dead child on the parent's recovery-process row",
    )
    assert f"recovery process {first} died (signal 9)" in row.last_error
    assert parent.proc.poll() is None  # the dispatcher itself never stopped
    # runtime.gcfreeze: the parent, and each recovery child (the first and its replacement) after its set-up.
    wait_until(
        lambda: parent.output().count("start-up objects frozen") >= 3,
        SAFETY,
        message="start-up objects frozen by the parent and both children",
    )

    parent.signal(signal.SIGTERM)
    assert parent.proc.wait(DEADLINE + 10) == 0, parent.output()
    wait_until(lambda: not alive(second), 5, message="the child to be gone with its parent")
    assert "did not stop" not in parent.output()
    assert not DispatcherProcess.objects.filter(pid=parent.proc.pid, stopped_at=None).exists()


def test_the_child_does_not_outlive_a_parent_killed_with_9(subprocess_env, processes):
    parent = processes(["rundispatcher", "--no-listen", "--domains", "delivery"], fast_env(subprocess_env))
    child = child_pid(parent)
    parent.proc.kill()
    parent.proc.wait(SAFETY)
    # Its lifeline (stdin) reads EOF: it stops its loops and exits; nobody else has to find it.
    wait_until(lambda: not alive(child), SAFETY, message=f"recovery child {child} to exit after its parent")


def test_recovery_in_process_and_no_dispatch_start_no_child(subprocess_env, processes):
    for args in (["--recovery-in-process"], ["--no-dispatch"]):
        parent = processes(["rundispatcher", "--domains", "delivery", *args], fast_env(subprocess_env))
        line = parent.wait_for_line("rundispatcher pid")
        assert "recovery-delivery" in line and "recovery-process" not in line
        wait_until(
            lambda p=parent: (h := heartbeat(p.proc.pid, "recovery-delivery")) and h.last_tick_at,
            SAFETY,
            message="an in-process recovery tick",
        )
        parent.signal(signal.SIGTERM)
        assert parent.proc.wait(DEADLINE + 10) == 0, parent.output()
        assert "recovery process pid" not in parent.output()


def test_a_dispatch_loop_hung_past_the_deadline_is_exit_code_3(subprocess_env, processes, blackhole):
    from dispatch_app import submit_many
    from tests.factories import PAYLOADS

    submit_many([("delivery", PAYLOADS["delivery"])])
    parent = processes(
        ["rundispatcher", "--domains", "delivery", "--shutdown-deadline", "1"], hanging_env(subprocess_env, blackhole)
    )
    held, _ = blackhole.accept()  # a send hangs: the dispatch loop cannot stop in time
    child = child_pid(parent)
    parent.signal(signal.SIGTERM)
    assert parent.proc.wait(SAFETY) == 3, parent.output()
    assert "loops still running at the deadline: dispatch" in parent.output()
    wait_until(lambda: not alive(child), 5, message="the child to be gone with its parent")
    held.close()


def test_a_bad_nice_value_is_a_usage_error(subprocess_env):
    from tests.helpers import MANAGE, PYTHON

    proc = subprocess.run(
        [PYTHON, MANAGE, "rundispatcher", "--recovery-nice", "40"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=SAFETY,
    )
    assert proc.returncode == 2
    assert "--recovery-nice: must be a nice increment 0-19, got 40" in proc.stderr


def connected_to(pid: int, port: int) -> bool:
    """Whether a process holds a TCP connection to 127.0.0.1:port (its socket inodes against /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open(f"/proc/{pid}/net/tcp") as table:
        for row in table.readlines()[1:]:
            fields = row.split()
            if int(fields[2].split(":")[1], 16) == port and fields[9] in inodes:
                return True
    return False


def test_a_recovery_round_hung_past_the_deadline_is_exit_code_3(subprocess_env, processes, blackhole):
    from dispatch_app import submit
    from tests.factories import PAYLOADS
    from tests.integration.recovery_helpers import dispatch_now, zero_thresholds

    submit("delivery", PAYLOADS["delivery"])
    dispatch_now()  # queued on the test Redis; the processes below see a Redis that never answers
    env = dict(
        hanging_env(subprocess_env, blackhole),
        DISPATCH_RECOVERY=json.dumps(zero_thresholds(PERIOD_SECONDS=0.2, JITTER_SECONDS=0)),
    )
    parent = processes(["rundispatcher", "--domains", "delivery", "--shutdown-deadline", "1"], env)
    child = child_pid(parent)
    port = blackhole.getsockname()[1]
    # The child's round asks Redis about the stale job and waits for an answer that never comes.
    wait_until(lambda: connected_to(child, port), SAFETY, message="the recovery child to be stuck on Redis")
    parent.signal(signal.SIGTERM)
    assert parent.proc.wait(SAFETY) == 3, parent.output()
    output = parent.output()
    assert "recovery loops still running at the deadline: recovery-delivery" in output  # the child's own report
    [parent_report] = re.findall(r"CommandError: loops still running at the deadline: (.*)", output)
    assert "recovery-process" in parent_report.split(", ")
    wait_until(lambda: not alive(child), 5, message="the child to be gone with its parent")
