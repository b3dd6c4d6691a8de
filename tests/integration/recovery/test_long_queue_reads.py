"""Readers of RQ's lists look at their head only: a backlog costs Redis the same bounded scan per job.

Redis runs one command at a time, so an LPOS over a million-id queue (13 ms here) holds up every send and take
behind it, and a page of jobs or a recovery round runs dozens. Recovery's evidence and the operator's RQ side
look for a job's id in the first ``RQ_LIST_READ_MAX`` ids of its lists; one further back is reported as waiting
and not looked for, never as missing (which would re-dispatch it). Real PostgreSQL, real Redis.
"""

from __future__ import annotations

import pytest

from dispatch_app import submit
from dispatch_app.config.tuning import RQ_LIST_READ_MAX
from dispatch_app.models import Job, JobEvent
from dispatch_app.recovery.evidence import rq_job
from dispatch_app.recovery.round import Round
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.state import jobs as rqjobs
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.recovery_helpers import age_jobs, dispatch_now, policy, statuses

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]

QUEUE_KEY = "rq:queue:delivery"
AHEAD = RQ_LIST_READ_MAX + 10  # ids put ahead of the job: it sits just past what readers look at


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def behind_a_backlog(redis_conn) -> tuple[Job, Job]:
    """Two dispatched delivery jobs: ``near`` at the head of the queue, ``far`` after AHEAD other ids."""
    far = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    redis_conn.lpush(QUEUE_KEY, *[f"backlog-{n}" for n in range(AHEAD)])
    near = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    redis_conn.lrem(QUEUE_KEY, 1, rq_job_id(near.pk, 1))
    redis_conn.lpush(QUEUE_KEY, rq_job_id(near.pk, 1))
    assert redis_conn.lpos(QUEUE_KEY, rq_job_id(far.pk, 1)) == AHEAD + 1
    return near, far


def test_recovery_leaves_a_job_past_the_read_head_alone_and_says_it_did_not_look(redis_conn, provider):
    near, far = behind_a_backlog(redis_conn)
    depth = AHEAD + 2

    assert rq_job(near.pk, 1, redis_conn).listed is True
    seen = rq_job(far.pk, 1, redis_conn)
    assert (seen.status, seen.listed, seen.unread_depth) == ("queued", None, depth)

    age_jobs([near.pk, far.pk], 600)
    result = Round(policy("delivery", QUEUED_STALE_SECONDS=60), redis=redis_conn, provider=provider).run_once()

    assert (result.left_alone, result.redispatched) == (2, 0)
    assert statuses([near, far]) == {near.pk: ("queued", 1), far.pk: ("queued", 1)}
    left = JobEvent.objects.filter(job=far, kind="recovery_leave_alone").get()
    assert f"of its queue's {depth:,} ids, the first {RQ_LIST_READ_MAX:,} looked at" in left.reason
    assert left.data["evidence"] == {"rq_status": "queued", "rq_unread_depth": depth}


def test_a_popped_job_is_still_told_from_a_waiting_one_once_the_backlog_is_short_again(redis_conn):
    near, far = behind_a_backlog(redis_conn)
    redis_conn.lrem(QUEUE_KEY, 1, rq_job_id(far.pk, 1))  # as a worker's BLPOP that died before its take
    assert rq_job(far.pk, 1, redis_conn).listed is None  # not known while the backlog is long
    redis_conn.ltrim(QUEUE_KEY, 0, RQ_LIST_READ_MAX - 1)
    assert rq_job(far.pk, 1, redis_conn).listed is False
    assert rq_job(near.pk, 1, redis_conn).listed is True


def test_the_rq_side_of_a_page_reports_a_job_past_the_read_head_as_waiting_further_back(redis_conn, provider, client):
    from django.contrib.auth.models import User

    near, far = behind_a_backlog(redis_conn)
    states = rqjobs.states([Job.objects.get(pk=near.pk), Job.objects.get(pk=far.pk)])
    assert (states[near.pk].position, states[near.pk].unread) == (1, None)
    assert (states[far.pk].position, states[far.pk].unread) == (None, AHEAD + 2)
    text, alarming = rqjobs.describe("queued", states[far.pk], fmt_instant=str)
    assert text == (
        f"queued in delivery past the first {RQ_LIST_READ_MAX:,} of {AHEAD + 2:,} (not looked for further), "
        "0 live workers"
    )
    assert alarming  # no worker serves it: the same alarm as for a job whose place is known

    client.force_login(User.objects.create_superuser("op", "op@example.invalid", "pw"))
    page = client.get(f"/admin/dispatch_app/job/{far.pk}/timeline/")
    assert page.status_code == 200
    assert f"further back than the first {RQ_LIST_READ_MAX} of the {AHEAD + 2} jobs".encode() in page.content
    assert b"not waiting in the queue" not in page.content


def test_a_worker_settling_a_lost_take_behind_a_backlog_looks_at_the_head_only(redis_conn):
    from rq import Queue
    from rq.job import Job as RQJob
    from rq.serializers import JSONSerializer

    from dispatch_app.rq.worker.fetch import Fetcher

    near, far = behind_a_backlog(redis_conn)
    queue = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    fetcher = Fetcher(redis_conn, [queue], RQJob, JSONSerializer, "settler")
    # Still at the head (the take never ran): nothing to do.
    assert fetcher.settle((0, rq_job_id(near.pk, 1), False), None) == ("listed", None)
    # Not looked for that far back: taken for popped and put back at the head, where the next take finds it (a
    # second entry further back would be refused by the database's start; a popped id is in no list at all).
    assert fetcher.settle((0, rq_job_id(far.pk, 1), False), None) == ("requeued", None)
    assert redis_conn.lindex(QUEUE_KEY, 0) == rq_job_id(far.pk, 1).encode()


def test_a_page_reads_each_lane_once_whatever_its_size_and_an_id_listed_twice_keeps_its_first_place(redis_conn):
    from dispatch_app.domains import lanes

    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(30)]
    dispatch_now()
    redis_conn.lpush(QUEUE_KEY, rq_job_id(jobs[5].pk, 1))  # anyone may push any id: listed twice now

    def calls(command: str) -> int:
        return redis_conn.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)

    before = calls("lrange"), calls("lpos")
    states = rqjobs.states(list(Job.objects.filter(pk__in=[job.pk for job in jobs])))
    assert (calls("lrange") - before[0], calls("lpos") - before[1]) == (len(lanes.queues("delivery")), 0)
    assert [states[job.pk].position for job in jobs[:6]] == [2, 3, 4, 5, 6, 1]
    assert {states[job.pk].depth for job in jobs} == {31}
