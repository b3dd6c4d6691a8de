"""Recovery's pacing against real PostgreSQL: what it reads of new work's wait, and the cap it puts on a round."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from rq.job import Job as RQJob

from dispatch_app import submit
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.models import JobEvent, RecoveryRound
from dispatch_app.recovery.loop import RecoveryLoop
from dispatch_app.recovery.pacing import MIN_SAMPLES, QUANTILE, Pacer, Sample, measure_wait
from dispatch_app.recovery.round import LOCK_NAMESPACE
from dispatch_app.rq.publish import rq_job_id
from dispatch_app.runtime.assembly import add_recovery_loops
from dispatch_app.runtime.supervisor import Supervisor
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.recovery_helpers import (
    dispatch_now,
    mark_rq_started,
    other_connection,
    policy,
    start_like_a_worker,
    statuses,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def set_attempt_times(job_ids, *, created_ago: float, waits_ms, dispatched_ago: float = 0.5) -> None:
    """Attempt 1 of each job: committed ``created_ago`` s ago, started ``wait`` ms later (None: not started)."""
    with connection.cursor() as cursor:
        for job_id, wait in zip(job_ids, waits_ms, strict=True):
            cursor.execute(
                "UPDATE dispatch_app_dispatchenvelope SET created_at = clock_timestamp() - make_interval(secs => %s), "
                "dispatched_at = clock_timestamp() - make_interval(secs => %s) WHERE job_id = %s AND attempt = 1 "
                "RETURNING created_at",
                [created_ago, dispatched_ago, job_id],
            )
            (created,) = cursor.fetchone()
            cursor.execute(
                "UPDATE dispatch_app_job SET started_at = %s + make_interval(secs => %s::float8 / 1000) WHERE id = %s",
                [created, wait, job_id],
            )
            assert cursor.rowcount == 1


def paced_loop(redis_conn, provider, now: list[float], looks: list[float], domain_policy, **pacer) -> RecoveryLoop:
    """A recovery loop on the injected clock ``now`` whose pacer reads new work's p99 wait from ``looks``, in turn."""
    waits = iter(looks)
    pacer = Pacer(
        window=5.0,
        tolerance=1.25,
        min_share=0.1,
        measure=lambda window: Sample(MIN_SAMPLES, next(waits)),
        clock=lambda: now[0],
        **pacer,
    )
    return RecoveryLoop(
        domain_policy, threading.Event(), clock=lambda: now[0], redis=redis_conn, provider=provider, pacer=pacer
    )


def slowed_after_a_quiet_look(redis_conn, provider, now: list[float], cap: int) -> RecoveryLoop:
    """As after a slow start, the whole cap until slowed: quiet at the first look (another domain's), slowed after."""
    loop = paced_loop(
        redis_conn,
        provider,
        now,
        [4.0, 40.0],
        policy("workflow", MAX_REDISPATCHES_PER_ROUND=cap),
        slack_ms=2.0,
        start_share=1.0,
    )
    loop.pacer.allowance("delivery", 25)
    now[0] += 5.0
    return loop


def slowed_every_second(redis_conn, provider, now: list[float]) -> RecoveryLoop:
    """A round per second, its cap 25, a floor of 10 % per 30 s; new work quiet once (the quietest), then slowed."""
    every_second = policy("workflow", PERIOD_SECONDS=1.0, JITTER_SECONDS=0.0, MAX_REDISPATCHES_PER_ROUND=25)
    return paced_loop(redis_conn, provider, now, [4.0] + [40.0] * 30, every_second, slack_ms=0.5, floor_seconds=30.0)


def die_mid_run(redis_conn, jobs) -> None:
    """Each job started by a worker that then died (RQ says started on it; no worker hash)."""
    for job in jobs:
        job.refresh_from_db()
        start_like_a_worker(job)
        mark_rq_started(redis_conn, job.pk, 1, "worker-that-died")


def lose_in_redis(redis_conn, jobs) -> None:
    """Each job's RQ job gone: a re-dispatch candidate that never started."""
    for job in jobs:
        redis_conn.delete(RQJob.key_for(rq_job_id(job.pk, 1)))


def percentile(values: list[float], q: float) -> float:
    """percentile_cont: linear between the two closest ranks."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def test_measure_reads_the_quantile_of_first_attempts_commit_to_start_in_the_window(redis_conn):
    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(30)]
    dispatch_now()
    waits = [float(i + 1) for i in range(24)]
    set_attempt_times([j.pk for j in jobs[:24]], created_ago=10.0, waits_ms=waits)
    # Dispatched before the window: not looked at, however slow.
    set_attempt_times([j.pk for j in jobs[24:27]], created_ago=100.0, waits_ms=[90_000.0] * 3, dispatched_ago=60.0)
    # Not dispatched yet (still in the outbox): the dispatcher's wait, not the workers'.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_app_dispatchenvelope SET status = 'pending', dispatched_at = NULL WHERE job_id = ANY(%s)",
            [[j.pk for j in jobs[27:]]],
        )

    sample = measure_wait(5.0)
    p90 = measure_wait(5.0, 0.9)

    assert sample.count == p90.count == 24
    assert sample.wait_ms == pytest.approx(percentile(waits, QUANTILE), abs=0.01)
    assert p90.wait_ms == pytest.approx(percentile(waits, 0.9), abs=0.01) and p90.wait_ms < sample.wait_ms


def test_a_job_still_waiting_counts_with_its_wait_so_far(redis_conn):
    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(10)]
    dispatch_now()
    set_attempt_times([j.pk for j in jobs[:8]], created_ago=30.0, waits_ms=[2.0] * 8)
    set_attempt_times([j.pk for j in jobs[8:]], created_ago=30.0, waits_ms=[None, None])

    sample = measure_wait(5.0)

    assert sample.count == 10
    # Two of ten still waiting, 30 s so far: the quantile sits between the last start (2 ms) and them.
    assert 2.0 < sample.wait_ms and sample.wait_ms >= percentile([2.0] * 8 + [30_000.0] * 2, QUANTILE) - 1.0


def test_a_slowed_new_work_cuts_the_rounds_redispatches_and_the_round_says_why(redis_conn, provider):
    jobs = [submit("workflow", PAYLOADS["workflow"]) for _ in range(8)]
    dispatch_now()
    redis_conn.flushdb()  # every job's RQ job is gone: each one is a re-dispatch candidate
    loop = slowed_after_a_quiet_look(redis_conn, provider, [0.0], cap=4)

    result = loop.run_once()

    # Paced to 2 of its cap of 4, the round looks at 2 candidates only (none read, looked up and then deferred);
    # the other 6 wait for the next round.
    assert (result.scanned, result.redispatched, result.has_more) == (2, 2, True)
    assert [c.outcome for c in result.candidates].count("deferred") == 0
    assert {c.job_id for c in result.candidates} == {j.pk for j in jobs[:2]}  # oldest first
    assert "paced to 2 (new work slowed" in result.paced
    redispatched = JobEvent.objects.filter(kind="recovery_redispatch", job_id__in=[j.pk for j in jobs])
    assert redispatched.count() == 2


def test_a_round_per_second_at_a_floor_of_one_job_per_30_s_sends_it_every_twelfth_round(redis_conn, provider):
    jobs = [submit("workflow", PAYLOADS["workflow"]) for _ in range(4)]
    dispatch_now()
    redis_conn.flushdb()  # every job's RQ job is gone: each one is a re-dispatch candidate
    now = [0.0]
    loop = slowed_every_second(redis_conn, provider, now)

    results = []
    for _ in range(12):
        results.append(loop.run_once())
        now[0] += 1.0

    # 10 % of 25 per 30 s is a twelfth of a job a second: eleven rounds that do not even look, then one job.
    assert [r.status for r in results[:11]] == ["paced out"] * 11 and loop.paced_out == 11
    assert all(r.has_more and "paced to 0" in r.paced for r in results[:11])
    assert (results[11].status, results[11].scanned, results[11].redispatched) == ("ok", 1, 1)
    assert RecoveryRound.objects.filter(domain="workflow").count() == 1  # a round that does not run leaves no row
    assert JobEvent.objects.filter(kind="recovery_redispatch", job_id__in=[j.pk for j in jobs]).count() == 1
    assert loop.rounds == 1 and loop.busy == 0


def test_a_paced_out_round_still_re_runs_a_job_whose_worker_died_and_nothing_that_never_started(redis_conn, provider):
    interrupted = submit("workflow", PAYLOADS["workflow"])
    lost = [submit("workflow", PAYLOADS["workflow"]) for _ in range(3)]
    dispatch_now()
    die_mid_run(redis_conn, [interrupted])
    lose_in_redis(redis_conn, lost)  # candidates the pacer holds back
    now = [0.0]
    loop = slowed_every_second(redis_conn, provider, now)

    first = loop.run_once()
    now[0] += 1.0
    second = loop.run_once()

    # Owed no job this second, the round still looks at the stale run (and only at it): a killed worker's job is
    # not held for the floor's 30 s. Then nothing but never-started work is left, and the next round is skipped.
    assert "paced to 0" in first.paced and first.status == "ok"
    assert [(c.job_id, c.decision) for c in first.candidates] == [(interrupted.pk, "redispatch")]
    assert (first.redispatched, first.has_more) == (1, True)
    assert second.status == "paced out" and (loop.rounds, loop.paced_out) == (1, 1)
    assert statuses([interrupted, *lost]) == {interrupted.pk: ("submitted", 2)} | {j.pk: ("queued", 1) for j in lost}


def test_a_paced_round_re_runs_every_stale_run_beside_its_paced_share_within_the_policy_cap(redis_conn, provider):
    lost = [submit("workflow", PAYLOADS["workflow"]) for _ in range(4)]
    runs = [submit("workflow", PAYLOADS["workflow"]) for _ in range(2)]
    dispatch_now()
    die_mid_run(redis_conn, runs)
    lose_in_redis(redis_conn, lost)
    loop = slowed_after_a_quiet_look(redis_conn, provider, [0.0], cap=5)

    result = loop.run_once()

    # Paced to 2 of 5: both stale runs and the 2 oldest that never started; the policy's cap still counts them all.
    assert "paced to 2 (new work slowed" in result.paced
    assert {c.job_id for c in result.candidates} == {j.pk for j in runs + lost[:2]}
    assert (result.redispatched, result.has_more) == (4, True)
    assert statuses(runs + lost) == {j.pk: ("submitted", 2) for j in runs + lost[:2]} | {
        j.pk: ("queued", 1) for j in lost[2:]
    }


def test_rundispatcher_loops_share_one_pacer_and_the_setting_removes_it():
    conf = dispatch_settings()
    supervisor = Supervisor(conf, listen=False, dispatch=False)
    add_recovery_loops(supervisor, conf, ["delivery", "workflow"])
    pacers = {id(r.loop.pacer) for r in supervisor.runners}
    assert len(supervisor.runners) == 2 and len(pacers) == 1 and supervisor.runners[0].loop.pacer is not None

    off = dispatch_settings(RECOVERY_PACING=False)
    supervisor = Supervisor(off, listen=False, dispatch=False)
    add_recovery_loops(supervisor, off, ["delivery"])
    assert supervisor.runners[0].loop.pacer is None


def test_a_scheduled_job_waits_from_its_due_time_not_from_its_submit(redis_conn):
    from datetime import timedelta

    prompt = [submit("delivery", PAYLOADS["delivery"]) for _ in range(4)]
    scheduled = [submit("delivery", PAYLOADS["delivery"], available_at=timedelta(seconds=60)) for _ in range(4)]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_app_dispatchenvelope SET available_at = clock_timestamp() WHERE job_id = ANY(%s)",
            [[j.pk for j in scheduled]],
        )
    dispatch_now()
    set_attempt_times([j.pk for j in prompt], created_ago=60.0, waits_ms=[3.0] * 4)
    set_attempt_times([j.pk for j in scheduled], created_ago=60.0, waits_ms=[13.0] * 4)
    with connection.cursor() as cursor:
        # Due 10 ms after it was committed (the attempts table keeps the due time the lease overwrote).
        cursor.execute(
            "UPDATE dispatch_app_jobattempt a SET due_at = e.created_at + interval '10 milliseconds' "
            "FROM dispatch_app_dispatchenvelope e "
            "WHERE e.job_id = a.job_id AND e.attempt = 1 AND a.attempt = 1 AND a.job_id = ANY(%s)",
            [[j.pk for j in scheduled]],
        )
        assert cursor.rowcount == 4

    sample = measure_wait(5.0)

    # From the submit the scheduled ones would read 13 ms (13 ms); from the due time, 3 ms like the others.
    assert sample.count == 8 and sample.wait_ms == pytest.approx(3.0, abs=0.01)


def held_out_loop(redis_conn, provider, now: list[float], *, candidates: int, floor_seconds: float, looks: int):
    """A round per second over ``candidates`` workflow jobs Redis lost, new work slowed after its first look."""
    jobs = [submit("workflow", PAYLOADS["workflow"]) for _ in range(candidates)]
    dispatch_now()
    redis_conn.flushdb()  # re-dispatch candidates
    every_second = policy("workflow", PERIOD_SECONDS=1.0, JITTER_SECONDS=0.0, MAX_REDISPATCHES_PER_ROUND=25)
    waits = [4.0] + [40.0] * looks
    return jobs, paced_loop(redis_conn, provider, now, waits, every_second, slack_ms=0.5, floor_seconds=floor_seconds)


def test_rounds_held_out_are_logged_at_info_once_a_minute_and_the_round_that_runs_again_says_so(
    redis_conn, provider, caplog
):
    now = [0.0]
    # A floor of 10 % of 25 per 300 s: about a job owed every 120 s, so the rounds are held out for over a minute.
    _, loop = held_out_loop(redis_conn, provider, now, candidates=1, floor_seconds=300, looks=200)
    caplog.set_level("INFO", logger="dispatch_app.recovery")

    statuses_seen = []
    while "ok" not in statuses_seen and len(statuses_seen) < 200:
        statuses_seen.append(loop.run_once().status)
        now[0] += 1.0

    held = [r for r in caplog.records if getattr(r, "action", None) == "recovery_paced_out"]
    resumed = [r.getMessage() for r in caplog.records if getattr(r, "action", None) == "recovery_resumed"]
    rounds_held = statuses_seen.index("ok")
    assert rounds_held > 60 and statuses_seen[:rounds_held] == ["paced out"] * rounds_held
    # The first held round, then one line a minute, each at INFO; not one per round.
    assert [r.levelname for r in held] == ["INFO"] * len(range(0, rounds_held, 60))
    assert held[0].getMessage().startswith("workflow: recovery held back, paced to 0 (")
    assert held[1].getMessage().endswith("(61 rounds held out over 60 s so far)")
    assert resumed == [f"workflow: recovery resumed after {rounds_held} round(s) held out over {rounds_held} s"]
    assert loop.rounds == 1 and loop.paced_out == rounds_held


def test_a_held_run_that_ends_on_another_sessions_round_does_not_say_this_process_resumed(redis_conn, provider, caplog):
    now = [0.0]
    # New work slowed throughout, a floor of a job per 12 rounds: runs of held rounds, each ended by a round owed a job.
    _, loop = held_out_loop(redis_conn, provider, now, candidates=1, floor_seconds=30, looks=300)
    caplog.set_level("INFO", logger="dispatch_app.recovery")
    while loop.run_once().status == "paced out" or not loop.paced_out:
        now[0] += 1.0
        assert now[0] < 100, "the pacer never held a round out"
    assert loop.rounds == 1  # the first told run ended on a round this process ran
    now[0] += 60.0  # the next run is told again (at most once a minute)
    with other_connection() as other:
        other.execute("SELECT pg_advisory_lock(%s, hashtext('workflow'))", [LOCK_NAMESPACE])
        statuses_seen = []
        while "paced out" not in statuses_seen or statuses_seen[-1] == "paced out":
            statuses_seen.append(loop.run_once().status)
            now[0] += 1.0
            assert len(statuses_seen) < 100, statuses_seen

    resumed = [r.getMessage() for r in caplog.records if getattr(r, "action", None) == "recovery_resumed"]
    assert statuses_seen[-1] == "busy" and loop.rounds == 1
    assert len(resumed) == 2 and resumed[0].startswith("workflow: recovery resumed after ")
    assert resumed[1].startswith("workflow: recovery no longer held back here (this round ran in another session)")


def test_short_runs_of_held_rounds_are_told_once_a_minute_not_once_a_run(redis_conn, provider, caplog):
    now = [0.0]
    # A floor of a job per 12 rounds, new work slowed throughout: runs of 11 held rounds.
    jobs, loop = held_out_loop(redis_conn, provider, now, candidates=8, floor_seconds=30, looks=100)
    caplog.set_level("INFO", logger="dispatch_app.recovery")

    statuses_seen = []
    for _ in range(90):
        statuses_seen.append(loop.run_once().status)
        now[0] += 1.0

    told = ("recovery_paced_out", "recovery_resumed")
    actions = [a for r in caplog.records if (a := getattr(r, "action", "")) in told]
    held_runs = "".join("h" if s == "paced out" else "r" for s in statuses_seen).split("r")
    assert statuses_seen.count("ok") == loop.rounds >= 6 and len([run for run in held_runs if run]) >= 6
    # Six runs of held rounds or more in 90 s: told at the first (and its end), then only the first run that
    # starts a minute or more after that report (and its end).
    assert actions == ["recovery_paced_out", "recovery_resumed"] * 2
    assert JobEvent.objects.filter(kind="recovery_redispatch", job_id__in=[j.pk for j in jobs]).count() == loop.rounds
