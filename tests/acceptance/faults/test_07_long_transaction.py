"""Scenario 7: a long transaction holds the oldest envelopes.

- An operator's transaction (another client) locks the ten oldest envelopes:
  the dispatcher passes over them (SKIP LOCKED) and dispatches the later ones;
  once it commits, the ten follow.
- A stuck session *of ours* (a process built from the project's settings that
  locks rows and then hangs inside its transaction) is ended by the server's
  ``idle_in_transaction_session_timeout``: its rows are dispatched while the
  process is still hung.
- Every session of ours carries ``statement_timeout``, ``lock_timeout`` and
  ``idle_in_transaction_session_timeout`` (Django's and the listener's), and the
  first two do cut a slow statement and a lock wait.
"""

import json
import subprocess
import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.helpers import PYTHON, ROOT, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(150)]

TIMEOUTS = {"PG_STATEMENT_TIMEOUT_MS": 1000, "PG_LOCK_TIMEOUT_MS": 500, "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS": 1500}


def envelope_ids(stack, job_ids):
    return [r[0] for r in stack.sql("SELECT id FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s)", [job_ids])]


def pending(stack, job_ids) -> int:
    return stack.scalar(
        "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND status = 'pending'", [job_ids]
    )


def succeeded(stack, job_ids) -> int:
    stack.check_alive()  # a process gone fails here, naming it, not after the wait's timeout
    return stack.scalar("SELECT count(*) FROM dispatch_app_job WHERE id = ANY(%s) AND status = 'succeeded'", [job_ids])


def test_locked_oldest_rows_do_not_block_and_our_stuck_sessions_are_cut(shared_stack):
    stack = shared_stack
    oldest = stack.submit(10, prefix="oldest")
    stuck_jobs = stack.submit(10, prefix="stuck")
    later = stack.submit(50, prefix="later")

    # A session of ours shows its timeouts and that they bite (a lock wait on the rows held below).
    with stack.connect() as operator:
        operator.execute("BEGIN")
        operator.execute(
            "SELECT id FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) FOR UPDATE", [oldest]
        ).fetchall()
        probe = subprocess.run(
            [PYTHON, "-m", "tests.acceptance.faults.probe_session", "timeouts", *map(str, envelope_ids(stack, oldest))],
            cwd=ROOT,
            env=stack.env(**TIMEOUTS),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode == 0, probe.stderr
        timeouts = json.loads(probe.stdout.strip().splitlines()[-1])

        stuck = stack.spawn(
            "stuck-session",
            [
                PYTHON,
                "-m",
                "tests.acceptance.faults.probe_session",
                "stuck",
                *map(str, envelope_ids(stack, stuck_jobs)),
            ],
            **TIMEOUTS,
        )
        wait_until(lambda: '"locked": 10' in stuck.output(), timeout=30, message="the stuck session's locks")
        stuck_locked_at = time.monotonic()

        dispatcher = stack.dispatcher("--poll-interval", "0.5", **TIMEOUTS)
        worker = stack.worker("delivery")
        # The later jobs themselves, not any 50: the stuck session's rows may already be free (its
        # idle-in-transaction timeout is 1.5 s) and run among them on a slow machine.
        wait_until(lambda: succeeded(stack, later) == 50, timeout=60, message="the later jobs, past the locked rows")
        assert pending(stack, oldest) == 10, "the locked rows were passed over, not waited for or taken"
        # The server ends our hung session: its rows go out while the process itself is still stuck.
        wait_until(lambda: pending(stack, stuck_jobs) == 0, timeout=30, message="the stuck session's rows")
        stuck_released_after = time.monotonic() - stuck_locked_at
        assert stuck.alive(), "the process is still hung; only its session was ended"
        assert pending(stack, oldest) == 10
        operator.execute("COMMIT")
    committed_at = time.monotonic()
    wait_until(lambda: pending(stack, oldest) == 0, timeout=30, message="the oldest rows after the commit")
    oldest_after_commit = time.monotonic() - committed_at
    stack.wait_all("succeeded", 70, timeout=60)
    stuck.stop()
    assert dispatcher.stop() == 0, dispatcher.output()
    worker.stop()

    for who in ("django", "listener"):
        assert timeouts[f"{who}.statement_timeout"] == "1s", timeouts
        assert timeouts[f"{who}.lock_timeout"] == "500ms", timeouts
        assert timeouts[f"{who}.idle_in_transaction_session_timeout"] == "1500ms", timeouts
    assert timeouts["slow_statement"].startswith("QueryCanceled"), timeouts
    assert timeouts["slow_statement_seconds"] < 5, timeouts
    assert timeouts["lock_wait"].startswith("LockNotAvailable"), timeouts
    assert timeouts["lock_wait_seconds"] < 5, timeouts

    report = invariants.check_stack(stack, expected_jobs=70)
    record_figures(
        "07_long_transaction",
        **report.figures(),
        stuck_session_rows_dispatched_after_seconds=round(stuck_released_after, 2),
        oldest_rows_dispatched_after_commit_seconds=round(oldest_after_commit, 2),
        statement_timeout_cut_after_seconds=timeouts["slow_statement_seconds"],
        lock_wait_cut_after_seconds=timeouts["lock_wait_seconds"],
    )
