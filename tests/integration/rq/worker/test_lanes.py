"""Recovered work goes to its domain's recovery lane, and the worker takes new work first (dispatch_app.domains.lanes).

Real PostgreSQL, real Redis, the real take script and the real PipelineWorker: a recovery round's
re-dispatches land in ``<queue>.recovery``; a worker takes new work before recovered work, a recovered
job alone and only when no new work was there, and under saturation one job in every
RECOVERY_LANE_EVERY from the recovery lane.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from rq import Queue
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from dispatch_app import submit
from dispatch_app.domains import lanes
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.recovery.round import Round
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.publish import redis_connection
from dispatch_app.rq.worker import PipelineWorker
from dispatch_app.rq.worker.fetch import Fetcher
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.recovery_helpers import dispatch_now, policy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]

RECOVERY = lanes.queue_name("delivery", lanes.RECOVERY)


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def test_lane_names_round_trip_and_never_collide_with_a_domain_queue():
    assert lanes.queues("delivery") == ("delivery", "delivery.recovery")
    assert lanes.split("delivery.recovery") == ("delivery", lanes.RECOVERY)
    assert lanes.split("delivery") == ("delivery", lanes.NEW)
    assert lanes.split("a.b") == ("a.b", lanes.NEW)  # not a lane suffix
    assert lanes.is_late("delivery.recovery") and not lanes.is_late("delivery")
    with pytest.raises(lanes.UnknownLane, match="unknown lane 'urgent'"):
        lanes.queue_name("delivery", "urgent")
    # Which lane each kind of re-dispatch uses (README, "Lanes").
    assert lanes.for_kind("recovery_redispatch") == lanes.RECOVERY
    assert lanes.for_kind("retry_after_failure") == lanes.RECOVERY
    assert lanes.for_kind("operator_retry_now") == lanes.NEW
    assert lanes.for_kind("operator_redispatch") == lanes.NEW


def lost_and_recovered(count: int, provider) -> list[Job]:
    """``count`` delivery jobs sent, lost from Redis, and re-dispatched by a recovery round (sent again)."""
    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(count)]
    dispatch_now()
    for job in jobs:
        RQJob.fetch(rq_job_id(job.pk, 1), connection=_conn()).delete()
    result = Round(policy("delivery"), redis=_conn(), provider=provider).run_once()
    assert result.redispatched == count, result
    dispatch_now()
    return jobs


def _conn():
    return redis_connection(settings.REDIS_URL)


def test_recovery_sends_into_the_recovery_lane_and_new_work_into_the_queue(redis_conn, provider):
    recovered = lost_and_recovered(2, provider)
    fresh = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    queues = dict(DispatchEnvelope.objects.filter(attempt=2).values_list("job_id", "queue"))
    assert queues == {job.pk: RECOVERY for job in recovered}
    assert DispatchEnvelope.objects.get(job=fresh).queue == "delivery"
    new_lane = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    late_lane = Queue(RECOVERY, connection=redis_conn, serializer=JSONSerializer)
    assert new_lane.job_ids == [rq_job_id(fresh.pk, 1)]
    assert late_lane.job_ids == [rq_job_id(job.pk, 2) for job in recovered]


def enqueue_raw(redis_conn, queue: str, ids: list[str]) -> None:
    """Jobs the take script moves and reads (it imports nothing): only their ids and hashes matter here."""
    q = Queue(queue, connection=redis_conn, serializer=JSONSerializer)
    for job_id in ids:
        q.enqueue("dispatch_app.run.delivery", 1, 1, job_id=job_id)


def fetcher(redis_conn) -> Fetcher:
    queues = [Queue(name, connection=redis_conn, serializer=JSONSerializer) for name in ("delivery", RECOVERY)]
    return Fetcher(redis_conn, queues, RQJob, JSONSerializer, "lanes-test")


def taken_ids(batch) -> list[str]:
    return [t.job.id for t in batch]


def test_the_take_never_holds_recovered_work_and_takes_it_only_when_no_new_work_is_there(redis_conn):
    f = fetcher(redis_conn)
    enqueue_raw(redis_conn, RECOVERY, ["r1", "r2", "r3"])
    # Only recovered work: one job, alone, however large the prefetch.
    assert taken_ids(f.take(8)) == ["r1"]
    enqueue_raw(redis_conn, "delivery", ["n1", "n2"])
    # New work waiting: the take is all new work, nothing recovered behind it in the worker's hand.
    assert taken_ids(f.take(8)) == ["n1", "n2"]
    # The share due: one recovered job first, then new work.
    enqueue_raw(redis_conn, "delivery", ["n3"])
    assert taken_ids(f.take(8, late_first=True)) == ["r2", "n3"]
    assert taken_ids(f.take(8, late_first=True)) == ["r3"]
    assert f.take(8) == []


def test_a_job_caught_by_the_blocking_wait_comes_from_the_new_lane_first(redis_conn):
    f = fetcher(redis_conn)
    enqueue_raw(redis_conn, RECOVERY, ["r1"])
    enqueue_raw(redis_conn, "delivery", ["n1"])
    index, job_id, _ = f.wait(1)
    assert (f.queues[index].name, job_id) == ("delivery", "n1")


def started_order(jobs: list[Job]) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM dispatch_app_job WHERE id = ANY(%s) ORDER BY started_at, id", [[j.pk for j in jobs]]
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("every", [3, 4])
def test_under_saturation_one_job_in_every_n_is_recovered_work_and_the_rest_is_new(redis_conn, provider, every):
    recovered = lost_and_recovered(4, provider)
    fresh = [submit("delivery", PAYLOADS["delivery"]) for _ in range(6)]
    dispatch_now()
    with override_settings(DISPATCH={"RECOVERY_LANE_EVERY": every}):
        worker = PipelineWorker(["delivery"], connection=redis_conn, name=f"lanes-{every}")
        assert [q.name for q in worker.queues] == ["delivery", RECOVERY]  # a domain queue brings its lane
        worker.work(burst=True)
    late = {job.pk for job in recovered}
    order = ["L" if pk in late else "N" for pk in started_order(recovered + fresh)]
    # Both lanes full: every `every`-th job is a recovered one; once new work runs out, the rest.
    expected = []
    new_left, late_left = len(fresh), len(recovered)
    while new_left or late_left:
        run = min(every - 1, new_left)
        expected += ["N"] * run
        new_left -= run
        if late_left:
            expected.append("L")
            late_left -= 1
    assert "".join(order) == "".join(expected)
    assert set(Job.objects.filter(pk__in=late | {j.pk for j in fresh}).values_list("status", flat=True)) == {
        "succeeded"
    }


def test_a_lane_named_alone_is_listened_on_alone(redis_conn):
    worker = PipelineWorker([RECOVERY], connection=redis_conn, name="recovery-only")
    assert [q.name for q in worker.queues] == [RECOVERY]


def test_the_rq_side_shows_each_lane_and_where_a_recovered_job_waits(redis_conn, provider):
    from dispatch_app.rq.state import jobs as rqjobs
    from dispatch_app.rq.state import queues as rqside

    recovered = lost_and_recovered(2, provider)
    fresh = [submit("delivery", PAYLOADS["delivery"]) for _ in range(3)]
    dispatch_now()
    snap = rqside.snapshot(redis_conn)
    seen = snap["domains"]["delivery"]
    assert seen["depth"] == 5
    assert {lane: v["depth"] for lane, v in seen["lanes"].items()} == {lanes.NEW: 3, lanes.RECOVERY: 2}
    assert seen["lanes"][lanes.RECOVERY]["queue"] == RECOVERY
    states = rqjobs.states(list(Job.objects.filter(pk__in=[j.pk for j in recovered + fresh])))
    late = states[recovered[1].pk]
    assert (late.queue, late.position, late.depth, late.behind_new) == (RECOVERY, 2, 2, 3)
    text, _ = rqjobs.describe("queued", late, fmt_instant=str)
    assert text == (
        f"#2 of 2 in {RECOVERY} (recovery lane: taken after the 3 new job(s) waiting: #5 in line), 0 live workers"
    )
    first = states[fresh[0].pk]
    assert (first.queue, first.position, first.behind_new) == ("delivery", 1, None)


def test_the_timeline_says_a_recovered_job_waits_in_the_recovery_lane_behind_new_jobs(redis_conn, provider, client):
    from django.contrib.auth.models import User

    recovered = lost_and_recovered(1, provider)
    [submit("delivery", PAYLOADS["delivery"]) for _ in range(2)]
    dispatch_now()
    client.force_login(User.objects.create_superuser("op", "op@example.invalid", "pw"))
    page = client.get(f"/admin/dispatch_app/job/{recovered[0].pk}/timeline/")
    assert page.status_code == 200
    assert b'id="pf-rq-lane">in the recovery lane, behind 2 new jobs that workers take first' in page.content


def test_the_dashboard_shows_the_recovery_lane_of_a_domain(redis_conn, provider, client):
    from django.contrib.auth.models import User

    lost_and_recovered(2, provider)
    submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    client.force_login(User.objects.create_superuser("op", "op@example.invalid", "pw"))
    page = client.get("/admin/dispatch_app/job/dashboard/live/")
    assert page.status_code == 200
    row = page.content.decode().split('id="pf-rq-delivery"', 1)[1].split("</tr>", 1)[0]
    assert "(2 in the recovery lane, oldest" in row
    assert ">3</a>" in row  # the depth counts both lanes


def test_a_worker_told_new_lanes_only_listens_on_the_domain_queue_alone(redis_conn):
    both = PipelineWorker(["delivery"], connection=redis_conn, name="both-lanes")
    new_only = PipelineWorker(["delivery"], connection=redis_conn, name="new-only", late_lanes=False)
    assert [q.name for q in both.queues] == ["delivery", RECOVERY]
    assert [q.name for q in new_only.queues] == ["delivery"]


def test_runworkers_gives_recovered_work_workers_of_its_own(monkeypatch):
    from django.core.management import CommandError, call_command

    import dispatch_app.management.commands.runworkers as command

    plans = []
    monkeypatch.setattr(command, "run", plans.append)
    monkeypatch.setattr(command, "require_migrated", lambda: None)
    call_command("runworkers", "--queues", "delivery", "--new-lanes-only", "--processes", "1")
    call_command("runworkers", "--queues", RECOVERY, "--nice", "10", "--processes", "1")
    call_command("runworkers", "--queues", "delivery", "--processes", "1")
    assert [(p.queues, p.late_lanes, p.nice) for p in plans] == [
        (("delivery",), False, 0),
        ((RECOVERY,), True, 10),
        (("delivery",), True, 0),
    ]
    with pytest.raises(CommandError, match="niceness 1-19, got 25"):
        call_command("runworkers", "--queues", RECOVERY, "--nice", "25")
