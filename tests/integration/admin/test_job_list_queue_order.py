"""The job list's RQ stage is sorted in the order workers take the jobs: the new lane from its head, then the
recovery lane after every new job; jobs with no place in Redis (taken, not there) last. Real Redis lists,
real PostgreSQL rows, read through the admin."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dispatch_app.domains import lanes
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.state import order as queue_order
from tests.integration.opsdata import job

JOBS = "/admin/dispatch_app/job/"
pytestmark = [pytest.mark.django_db, pytest.mark.version_dependent]


def push(redis_conn, lane_queue: str, *jobs):
    redis_conn.rpush(f"rq:queue:{lane_queue}", *[rq_job_id(j.pk, j.attempt) for j in jobs])


def listed(client, query: str) -> list[int]:
    response = client.get(f"{JOBS}?{query}")
    assert response.status_code == 200
    return [j.pk for j in response.context["cl"].result_list]


def test_the_rq_stage_lists_jobs_in_the_order_workers_take_them(client, redis_conn):
    # Dispatched in the order j1 … j5 (first dispatch order, what the list sorted by before).
    j1, j2, j3, j4, j5 = (job("delivery", "queued", dispatched_ago=100 - i) for i in range(5))
    push(redis_conn, "delivery", j5, j3)  # the new lane: j5 at its head (an operator's retry, say)
    push(redis_conn, lanes.queue_name("delivery", lanes.RECOVERY), j2, j1)  # after every new job
    # j4 is in no list (a worker took it and has not started it): no place, last.
    other = job("agent", "queued", dispatched_ago=200)
    push(redis_conn, "agent", other)

    positions, errors = queue_order.positions(["delivery"], conn=redis_conn)
    assert errors == []
    assert positions == {f"{j5.pk}-1": 1, f"{j3.pk}-1": 2, f"{j2.pk}-1": 3, f"{j1.pk}-1": 4}

    client.force_login(User.objects.create_superuser("op", password="pw"))
    expected = [j5.pk, j3.pk, j2.pk, j1.pk, j4.pk]
    assert listed(client, "stage=rq&domain__exact=delivery") == expected
    assert listed(client, "status__exact=queued&domain__exact=delivery") == expected
    # Every domain: each queue's #1 first (ties by dispatch time), the placeless last.
    assert listed(client, "stage=rq") == [other.pk, *expected]
    # Elsewhere the list stays newest first.
    assert listed(client, "domain__exact=delivery") == sorted(expected, reverse=True)


def test_a_stale_attempt_in_the_queue_gives_the_job_no_place(client, redis_conn):
    """A queue entry of an earlier attempt is not the job's: the worker's start refuses it."""
    moved_on = job("delivery", "queued", attempt=2, dispatched_ago=50)
    waiting = job("delivery", "queued", dispatched_ago=10)
    redis_conn.rpush("rq:queue:delivery", rq_job_id(moved_on.pk, 1), rq_job_id(waiting.pk, 1))
    client.force_login(User.objects.create_superuser("op", password="pw"))
    assert listed(client, "stage=rq") == [waiting.pk, moved_on.pk]


def test_an_unreadable_redis_leaves_the_list_in_dispatch_order(client, redis_conn, settings):
    from tests.integration.admin.test_dashboard_render import closed_port, queues_on

    first = job("delivery", "queued", dispatched_ago=20)
    second = job("delivery", "queued", dispatched_ago=10)
    push(redis_conn, "delivery", second, first)
    down = f"redis://127.0.0.1:{closed_port()}/0?socket_connect_timeout=1&socket_timeout=1"
    settings.RQ_QUEUES = queues_on(down)
    client.force_login(User.objects.create_superuser("op", password="pw"))
    assert listed(client, "stage=rq") == [first.pk, second.pk]
