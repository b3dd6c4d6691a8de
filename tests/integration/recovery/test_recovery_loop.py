"""The per-domain loop: its period, no continuation on a full batch, one round per domain at a time."""

from __future__ import annotations

import random
import threading

import pytest
from django.db import connections

from dispatch_app import submit
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.config.tuning import RECOVERY_SPREAD_MAX, RECOVERY_SPREAD_SHARE
from dispatch_app.dispatch.wake import TICK
from dispatch_app.domains.providers import LocalProvider, set_provider
from dispatch_app.models import DispatchEnvelope, Job, RecoveryRound
from dispatch_app.recovery.loop import RecoveryLoop
from dispatch_app.recovery.round import Round, RoundSignals
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.runtime.assembly import add_recovery_loops
from dispatch_app.runtime.runner import LoopRunner
from dispatch_app.runtime.supervisor import Supervisor
from tests.factories import PAYLOADS
from tests.integration.recovery_helpers import dispatch_now, policy, statuses

pytestmark = pytest.mark.django_db(transaction=True)
SAFETY = 30  # seconds: a bound on waits that should end at once, never a timing assumption


@pytest.fixture(autouse=True)
def provider(tmp_path):
    set_provider(LocalProvider(root=tmp_path))
    yield
    set_provider(None)


class FakeTime:
    """A clock that moves only when the loop waits; each wait is recorded and can be held."""

    def __init__(self, stop: threading.Event):
        self.now = 1000.0
        self.stop = stop
        self.pauses: list[float] = []
        self.waiting = threading.Semaphore(0)  # released each time the loop starts a wait
        self.go = threading.Semaphore(0)  # the test lets one wait end

    def clock(self) -> float:
        return self.now

    def wait(self, timeout: float) -> bool:
        self.pauses.append(timeout)
        self.waiting.release()
        while not self.go.acquire(timeout=0.05):
            if self.stop.is_set():
                return True
        self.now += timeout
        return False


def test_full_batch_reports_has_more_and_the_next_round_waits_a_full_period(redis_conn):
    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(4)]  # B + 1 with B = 3
    dispatch_now()
    redis_conn.flushdb()
    stop = threading.Event()
    fake = FakeTime(stop)
    rounds: list = []
    finished = threading.Semaphore(0)

    def on_finished(result):
        rounds.append(result)
        finished.release()

    looped = policy("delivery", BATCH_SIZE=3, PERIOD_SECONDS=30, JITTER_SECONDS=4)
    loop = RecoveryLoop(
        looped,
        stop,
        clock=fake.clock,
        rand=random.Random(7),
        waiter=fake.wait,
        signals=RoundSignals(finished=on_finished),
        redis=redis_conn,
    )
    replay = random.Random(7)
    first_jitter, second_jitter = replay.uniform(0, 4), replay.uniform(0, 4)
    runner = LoopRunner(loop, stop, domain="delivery")
    runner.start()
    try:
        assert fake.waiting.acquire(timeout=SAFETY)
        assert fake.pauses == [pytest.approx(first_jitter)]  # first round: a share of the jitter only
        fake.go.release()
        assert finished.acquire(timeout=SAFETY)
        assert (rounds[0].scanned, rounds[0].redispatched, rounds[0].has_more) == (3, 3, True)
        # The round's re-dispatches are spread: over min(0.8 x 30 s, 30 s) = 24 s, 3 jobs one step of 8 s apart
        # (floored to the 0.1 s grid).
        step = min(RECOVERY_SPREAD_SHARE * 30, RECOVERY_SPREAD_MAX) / 3
        assert step == pytest.approx(8)
        envelopes = DispatchEnvelope.objects.filter(attempt=2).order_by("job_id")
        offsets = [(e.available_at - e.created_at).total_seconds() for e in envelopes]
        assert offsets[0] == pytest.approx(0, abs=0.01)
        assert step - 0.1 < offsets[1] <= step + 0.01 and 2 * step - 0.1 < offsets[2] <= 2 * step + 0.01

        # Full batch, has_more: still the loop asks for a full period (+ jitter), not for "at once".
        assert fake.waiting.acquire(timeout=SAFETY)
        assert fake.pauses[1] == pytest.approx(30 + second_jitter)
        assert len(rounds) == 1
        assert statuses(jobs[3:]) == {jobs[3].pk: ("queued", 1)}

        fake.go.release()  # the period passes
        assert finished.acquire(timeout=SAFETY)
        assert (rounds[1].scanned, rounds[1].redispatched, rounds[1].has_more) == (1, 1, False)
        assert [c.job_id for c in rounds[1].candidates] == [jobs[3].pk]
        assert fake.waiting.acquire(timeout=SAFETY)
    finally:
        stop.set()
        assert runner.join(SAFETY)
    assert RecoveryRound.objects.filter(domain="delivery").count() == 2


def test_a_round_error_is_logged_with_the_domain_and_the_loop_goes_on(redis_conn, caplog, monkeypatch):
    stop = threading.Event()
    fake = FakeTime(stop)
    calls = []

    def failing_discover(p):
        calls.append(p.domain)
        if len(calls) == 1:
            raise RuntimeError("database hiccup")
        return real_discover(p)

    from dispatch_app.recovery import discovery

    real_discover = discovery.discover
    monkeypatch.setattr(discovery, "discover", failing_discover)
    loop = RecoveryLoop(policy("agent"), stop, clock=fake.clock, waiter=fake.wait, redis=redis_conn)
    runner = LoopRunner(loop, stop, domain="agent", error_backoff=0.01)
    runner.start()
    try:
        for _ in range(2):  # the first wait, then the wait after the failed round
            assert fake.waiting.acquire(timeout=SAFETY)
            fake.go.release()
        assert fake.waiting.acquire(timeout=SAFETY)
    finally:
        stop.set()
        assert runner.join(SAFETY)
    assert runner.errors == 1 and loop.rounds == 1
    errors = [r for r in caplog.records if getattr(r, "action", "") == "recovery_error"]
    assert (
        errors and errors[0].domain == "agent" and "database hiccup" in errors[0].getMessage() + str(errors[0].exc_info)
    )
    failed, ok = RecoveryRound.objects.filter(domain="agent").order_by("id")
    assert "database hiccup" in failed.error and failed.finished_at is not None and ok.error == ""


def test_one_round_per_domain_at_a_time_across_sessions_other_domains_run(redis_conn):
    held, release = threading.Event(), threading.Event()
    outcome = {}

    def hold(found):
        held.set()
        assert release.wait(SAFETY)

    def holder():
        try:
            signals = RoundSignals(after_discovery=hold)
            outcome["held"] = Round(policy("delivery"), redis=redis_conn, signals=signals).run_once()
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(SAFETY)
        # This thread has its own connection (its own PostgreSQL session).
        busy = Round(policy("delivery"), redis=redis_conn).run_once()
        other_domain = Round(policy("workflow"), redis=redis_conn).run_once()
        assert (busy.ran, busy.status, busy.round_id) == (False, "busy", None)
        assert (other_domain.ran, other_domain.status) == (True, "ok")
    finally:
        release.set()
        thread.join(SAFETY)
    assert outcome["held"].ran
    assert Round(policy("delivery"), redis=redis_conn).run_once().ran  # the lock was given back
    assert RecoveryRound.objects.filter(domain="delivery").count() == 2


def test_rundispatcher_assembly_adds_one_named_loop_per_domain(settings):
    settings.DISPATCH = {"RECOVERY": {"agent": {"PERIOD_SECONDS": 5}}}
    conf = dispatch_settings()
    supervisor = Supervisor(conf, listen=False)
    add_recovery_loops(supervisor, conf, ["delivery", "agent"])
    assert supervisor.loop_names() == ["dispatch", "recovery-delivery", "recovery-agent"]
    loops = [r.loop for r in supervisor.runners[1:]]
    assert [loop.policy.period_seconds for loop in loops] == [30.0, 5.0]
    assert all(loop.stop is supervisor.stop for loop in loops)
    assert loops[0].wait.__self__ is loops[0] and TICK == "tick"


def test_a_stale_job_left_alone_does_not_hold_the_front_of_the_batch(redis_conn):
    from rq.serializers import JSONSerializer
    from rq.worker import SimpleWorker

    from tests.integration.recovery_helpers import mark_rq_started, start_like_a_worker

    running = submit("agent", PAYLOADS["agent"])
    lost = submit("agent", PAYLOADS["agent"])
    dispatch_now()
    running.refresh_from_db()
    start_like_a_worker(running)
    worker = SimpleWorker(["agent"], connection=redis_conn, serializer=JSONSerializer, name="busy-agent")
    worker.register_birth()
    mark_rq_started(redis_conn, running.pk, 1, "busy-agent")
    Job.objects.filter(pk=lost.pk).update(status="queued")  # after the running one in updated_at order
    redis_conn.delete(f"rq:job:{rq_job_id(lost.pk, 1)}")
    narrow = policy("agent", BATCH_SIZE=1, RUNNING_STALE_SECONDS=0)

    first = Round(narrow, redis=redis_conn).run_once()
    second = Round(narrow, redis=redis_conn).run_once()
    worker.register_death()

    assert [(c.job_id, c.decision) for c in first.candidates] == [(running.pk, "leave_alone")]
    assert [(c.job_id, c.decision) for c in second.candidates] == [(lost.pk, "redispatch")]
