"""dispatch_app.store.transitions: each move is a compare-and-set that refuses a job not in its from-state, and of two
concurrent transactions moving one job only one wins (the loser, blocked on the row, re-checks and finds it moved)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection, connections, transaction
from psycopg.types.json import Jsonb

from dispatch_app import submit
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.store import batch_redispatch, transitions
from dispatch_app.store.transitions import IllegalTransition
from tests.factories import PAYLOADS
from tests.helpers import wait_until
from tests.integration.recovery_helpers import dispatch_now, other_connection

pytestmark = pytest.mark.django_db(transaction=True)
SAFETY = 30


def status(job) -> tuple[str, int]:
    return tuple(Job.objects.filter(pk=job.pk).values_list("status", "attempt").get())


def waiting_on_a_lock(pid: int) -> bool:
    with other_connection() as probe:
        row = probe.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return row is not None and row[0] == "Lock"


class Blocked:
    """Runs ``move(cursor)`` on its own autocommit session in a thread; ``pid`` is known before it runs."""

    def __init__(self, move):
        self.session = psycopg.connect(**listener_conninfo(), autocommit=True)
        self.pid = self.session.info.backend_pid
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(move,))
        self.thread.start()

    def _run(self, move):
        with self.session.cursor() as cursor:
            self.result = move(cursor)

    def outcome(self):
        self.thread.join(SAFETY)
        assert not self.thread.is_alive()
        self.session.close()
        return self.result


def test_finish_refuses_a_job_that_is_not_running(redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    with connection.cursor() as cursor:
        assert transitions.finish(cursor, job.pk, 1, "succeeded", Jsonb({"x": 1})) is False
        assert status(job) == ("submitted", 1)
        dispatch_now()
        assert transitions.finish(cursor, job.pk, 1, "succeeded") is False
        assert status(job) == ("queued", 1)
        assert transitions.start(cursor, "w1", job.pk, 1) is not None
        assert transitions.finish(cursor, job.pk, 2, "succeeded") is False  # not this attempt
        assert transitions.finish(cursor, job.pk, 1, "succeeded") is True
        assert transitions.finish(cursor, job.pk, 1, "failed") is False  # finished once
    assert status(job) == ("succeeded", 1)


def test_a_job_starts_once_and_never_after_it_finished_or_was_cancelled():
    started, cancelled = submit("delivery", PAYLOADS["delivery"]), submit("delivery", PAYLOADS["delivery"])
    with connection.cursor() as cursor:
        assert transitions.start(cursor, "w1", started.pk, 1) is not None
        assert transitions.start(cursor, "w2", started.pk, 1) is None
        assert transitions.cancel(cursor, cancelled.pk) == (1, "submitted")
        assert transitions.start(cursor, "w1", cancelled.pk, 1) is None
        assert transitions.cancel(cursor, cancelled.pk) is None  # already finished
    assert status(cancelled) == ("cancelled", 1)


def test_a_finish_waiting_behind_recoverys_verdict_finds_the_job_moved_on():
    job = submit("agent", PAYLOADS["agent"])
    with connection.cursor() as cursor:
        transitions.start(cursor, "w1", job.pk, 1)
    with other_connection() as recovery:  # its own transaction, not yet committed
        assert transitions.conclude(recovery.cursor(), job.pk, 1, "running", "outcome_unknown", "worker gone")
        worker = Blocked(lambda cursor: transitions.finish(cursor, job.pk, 1, "succeeded", Jsonb({"late": True})))
        wait_until(lambda: waiting_on_a_lock(worker.pid), SAFETY, message="the finish to wait on the job's row")
        recovery.commit()
    assert worker.outcome() is False
    assert status(job) == ("outcome_unknown", 1)
    assert Job.objects.get(pk=job.pk).result is None


def test_a_start_waiting_behind_a_cancel_does_not_start():
    job = submit("delivery", PAYLOADS["delivery"])
    with other_connection() as operator:
        assert transitions.cancel(operator.cursor(), job.pk) == (1, "submitted")
        worker = Blocked(lambda cursor: transitions.start(cursor, "w1", job.pk, 1))
        wait_until(lambda: waiting_on_a_lock(worker.pid), SAFETY, message="the start to wait on the job's row")
        operator.commit()
    assert worker.outcome() is None
    assert status(job) == ("cancelled", 1)


def test_a_cancel_that_waited_for_a_rolled_back_verdict_wins():
    job = submit("delivery", PAYLOADS["delivery"])
    with connection.cursor() as cursor:
        transitions.start(cursor, "w1", job.pk, 1)
    with other_connection() as recovery:
        assert transitions.conclude(recovery.cursor(), job.pk, 1, "running", "failed", "gave up")
        operator = Blocked(lambda cursor: transitions.cancel(cursor, job.pk))
        wait_until(lambda: waiting_on_a_lock(operator.pid), SAFETY, message="the cancel to wait on the job's row")
        recovery.rollback()
    assert operator.outcome() == (1, "running")
    assert status(job) == ("cancelled", 1)


def test_two_redispatches_of_one_attempt_make_one_next_attempt():
    job = submit("delivery", PAYLOADS["delivery"])
    second: dict = {}
    ready = threading.Event()

    def redispatch_too():
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    second["pid"] = cursor.fetchone()[0]
                ready.set()
                second["attempt"] = transitions.redispatch(job.pk, 1, kind="recovery_redispatch", reason="two")
        finally:
            connections.close_all()

    with transaction.atomic():
        assert transitions.redispatch(job.pk, 1, kind="operator_redispatch", reason="one") == 2
        thread = threading.Thread(target=redispatch_too)
        thread.start()
        assert ready.wait(SAFETY)
        wait_until(lambda: waiting_on_a_lock(second["pid"]), SAFETY, message="the second redispatch to wait")
    thread.join(SAFETY)
    assert second["attempt"] is None
    assert status(job) == ("submitted", 2)
    assert sorted(DispatchEnvelope.objects.filter(job=job).values_list("attempt", flat=True)) == [1, 2]


@pytest.mark.parametrize(
    ("move", "message"),
    [
        (lambda c: transitions.finish(c, 1, 1, "running"), "a worker finishes a job as one of .*, not 'running'"),
        (lambda c: transitions.finish(c, 1, 1, "cancelled"), "not 'cancelled'"),
        (lambda c: transitions.conclude(c, 1, 1, "running", "succeeded", ""), "recovery concludes a job as one of"),
        (lambda c: transitions.conclude(c, 1, 1, "succeeded", "failed", ""), "only an unfinished job, not a 'succe"),
    ],
)
def test_a_move_to_a_status_it_can_never_produce_is_a_bug_not_a_race(move, message):
    with connection.cursor() as cursor, pytest.raises(IllegalTransition, match=message):
        move(cursor)


def test_a_succeeded_or_cancelled_job_is_never_redispatched():
    job = submit("delivery", PAYLOADS["delivery"])
    with transaction.atomic(), pytest.raises(IllegalTransition, match="never re-dispatched"):
        transitions.redispatch(job.pk, 1, kind="x", reason="y", allowed_statuses=("failed", "cancelled"))
    assert status(job) == ("submitted", 1)


def test_redispatch_many_moves_each_job_by_its_own_compare_and_set():
    from dispatch_app.models import JobEvent

    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(4)]
    dispatch_now()  # all queued, attempt 1
    finished, stale_attempt = jobs[1], jobs[2]
    Job.objects.filter(pk=finished.pk).update(status="succeeded")
    seen = [
        (jobs[0].pk, 1, "queued", "lost", {"round": 7}),
        (finished.pk, 1, "queued", "lost", {"round": 7}),  # finished since it was seen: not touched
        (stale_attempt.pk, 2, "queued", "lost", {"round": 7}),  # seen at an attempt it is not at
        (jobs[3].pk, 1, "queued", "lost too", {"round": 7}),
    ]
    with transaction.atomic():
        moved = batch_redispatch.redispatch_many("delivery", seen, kind="recovery_redispatch")

    assert moved == {jobs[0].pk: 2, jobs[3].pk: 2}
    assert [status(j) for j in jobs] == [("submitted", 2), ("succeeded", 1), ("queued", 1), ("submitted", 2)]
    pending = DispatchEnvelope.objects.filter(attempt=2, status="pending")
    # Recovery's re-dispatches go to the domain's recovery lane (dispatch_app.domains.lanes).
    assert sorted(pending.values_list("job_id", "queue")) == sorted(
        [(jobs[0].pk, "delivery.recovery"), (jobs[3].pk, "delivery.recovery")]
    )
    events = {e.job_id: e for e in JobEvent.objects.filter(kind="recovery_redispatch")}
    assert set(events) == {jobs[0].pk, jobs[3].pk}
    assert (events[jobs[3].pk].attempt, events[jobs[3].pk].reason) == (1, "lost too")
    assert events[jobs[3].pk].data == {"round": 7, "next_attempt": 2, "delay_seconds": 0.0}


def test_redispatch_many_spreads_the_due_times_over_the_span_in_steps():
    from dispatch_app.models import JobEvent

    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(7)]
    dispatch_now()
    seen = [(j.pk, 1, "queued", "lost", {}) for j in jobs]
    with transaction.atomic(), connection.cursor() as cursor:
        moved = batch_redispatch.redispatch_many(
            "delivery", seen, kind="recovery_redispatch", spread_seconds=3.0, min_step=1.0
        )
        cursor.execute("SELECT clock_timestamp()")
        (before_commit,) = cursor.fetchone()
    assert len(moved) == 7
    # 3 steps of 1 s (7 jobs: 3, 3, 1), in job id order, the first due at once, the others k s on floored to a
    # whole second (the grid is min_step: every domain's steps fall on the same instants).
    rows = DispatchEnvelope.objects.filter(attempt=2).order_by("job_id").values_list("created_at", "available_at")
    offsets = [(due - created).total_seconds() for created, due in rows]
    steps = [0, 0, 0, 1, 1, 1, 2]
    assert all(offset <= 0.001 for offset in offsets[:3])
    assert all(k - 1 < offset <= k + 0.001 for k, offset in zip(steps[3:], offsets[3:], strict=True))
    assert all(due.timestamp() == int(due.timestamp()) for _, due in rows[3:])
    assert max(due for _, due in rows) > before_commit  # in the future, not already due
    delays = dict(JobEvent.objects.filter(kind="recovery_redispatch").values_list("job_id", "data__delay_seconds"))
    assert [delays[j.pk] for j in sorted(jobs, key=lambda j: j.pk)] == [round(max(o, 0), 3) for o in offsets]


@pytest.mark.parametrize(
    ("count", "spread", "step", "expected"),
    [
        (25, 0.8, 0.1, (4, 0.1)),  # a round per second: 8 steps at most, so 4 a step (7 steps used)
        (25, 10.0, 0.1, (1, 0.4)),  # one job per step, 0.4 s apart
        (1, 10.0, 0.1, (1, 0.0)),
        (25, 0.0, 0.1, (25, 0.0)),  # no spread: all due now
        (3, 0.05, 0.1, (3, 0.05)),  # a span shorter than a step: one step
    ],
)
def test_spread_steps(count, spread, step, expected):
    per_step, seconds = batch_redispatch.spread_steps(count, spread, step)
    assert (per_step, round(seconds, 6)) == expected


def test_redispatch_many_refuses_a_finished_status_and_a_job_of_another_domain():
    job = submit("delivery", PAYLOADS["delivery"])
    other = submit("workflow", PAYLOADS["workflow"])
    with transaction.atomic(), pytest.raises(IllegalTransition, match="not a 'succeeded' one"):
        batch_redispatch.redispatch_many("delivery", [(job.pk, 1, "succeeded", "r", {})], kind="x")
    with transaction.atomic():
        assert batch_redispatch.redispatch_many("delivery", [(other.pk, 1, "submitted", "r", {})], kind="x") == {}
    assert status(other) == ("submitted", 1)
