"""One Redis per group of queues: each domain's queue lives on the server its RQ_QUEUES entry names.

Two private redis-servers, "delivery" on one and "workflow" on the other. The
dispatcher sends each domain to its own server with one breaker per server:
taking one server down backs off only its domain's sends (its envelopes stay
pending, uncounted, never dead) while the other domain keeps dispatching and its
jobs keep running. Recovery reads a domain's evidence on that domain's server.
The loop's breakers run on an injected clock; the give-back delay is database
time, so the test moves ``available_at`` into the past where the clock would have.
"""

import pytest
from django.conf import settings
from django.test import override_settings
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from dispatch_app import submit_many
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.domains.policy import resolve
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.recovery.evidence import rq_job_status
from dispatch_app.recovery.round import Round
from dispatch_app.rq import servers as redis_servers
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.publish import Publisher
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.loop_kit import loop_settings
from tests.private_servers import PrivateRedis, make_base_dir, remove_tree

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.path_dependent]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


@pytest.fixture
def two_redis():
    bases = [make_base_dir("pf-perdomain-a-"), make_base_dir("pf-perdomain-b-")]
    servers = [PrivateRedis(base) for base in bases]
    for server in servers:
        server.start()
    queues = {name: dict(entry) for name, entry in settings.RQ_QUEUES.items()}
    # Bounded calls on the private servers too (what settings add to REDIS_URL_<QUEUE>).
    queues["delivery"]["URL"] = servers[0].url + "&socket_timeout=5&socket_connect_timeout=5"
    queues["workflow"]["URL"] = servers[1].url + "&socket_timeout=5&socket_connect_timeout=5"
    with override_settings(RQ_QUEUES=queues):
        yield servers
    for server, base in zip(servers, bases, strict=True):
        server.stop()
        remove_tree(base)


def _due_now() -> None:
    DispatchEnvelope.objects.filter(status="pending").update(available_at="2000-01-01T00:00:00Z")


def _run_delivery_jobs(server: PrivateRedis) -> None:
    client = server.client()
    queue = Queue("delivery", connection=client, serializer=JSONSerializer)
    SimpleWorker([queue], connection=client, serializer=JSONSerializer).work(burst=True)


def _pending_uncounted(jobs) -> int:
    return DispatchEnvelope.objects.filter(
        job__in=[j.pk for j in jobs], status="pending", send_attempts=0, lease_token=None
    ).count()


def test_each_domain_goes_to_its_own_redis_and_one_outage_pauses_only_its_domain(two_redis, provider):
    up, down = two_redis
    conf = loop_settings(BATCH_SIZE=20, SEND_CHUNK_SIZE=5, MAX_SEND_ATTEMPTS=1, SEND_BACKOFF_BASE=1.0)
    clock = Clock()
    loop = DispatchLoop(conf, publisher=Publisher(conf), clock=clock)
    try:
        up_url, down_url = redis_servers.queue_url("delivery"), redis_servers.queue_url("workflow")
        assert set(loop.breakers) == {settings.REDIS_URL, up_url, down_url}

        first = submit_many([("delivery", PAYLOADS["delivery"])] * 3 + [("workflow", PAYLOADS["workflow"])] * 3)
        assert loop.run_once().dispatched == 6
        assert up.client().llen("rq:queue:delivery") == 3 and up.client().llen("rq:queue:workflow") == 0
        assert down.client().llen("rq:queue:workflow") == 3 and down.client().llen("rq:queue:delivery") == 0
        # Recovery asks the domain's own server for its evidence.
        workflow_job = next(j for j in first if j.domain == "workflow")
        assert Round(resolve("workflow")).redis is redis_servers.queue_connection("workflow")
        assert rq_job_status(workflow_job.pk, workflow_job.attempt, Round(resolve("workflow")).redis)[0] == "queued"

        down.stop()
        during = submit_many([("delivery", PAYLOADS["delivery"])] * 4 + [("workflow", PAYLOADS["workflow"])] * 4)
        delivery = [j for j in during if j.domain == "delivery"]
        workflow = [j for j in during if j.domain == "workflow"]
        result = loop.run_once()
        assert (result.dispatched, result.outage_released, result.dead, result.failed) == (4, 4, 0, 0)
        assert loop.breakers[down_url].state == "open" and loop.breakers[up_url].state == "closed"
        assert "[unix://" in result.breaker.reason, "the observers are told which server refuses"
        assert result.breaker.pauses == 1
        # MAX_SEND_ATTEMPTS is 1: had the outage counted, the workflow envelopes would be dead.
        assert _pending_uncounted(workflow) == 4
        assert Job.objects.filter(pk__in=[j.pk for j in delivery], status="queued").count() == 4

        # Still down, the probe not due: new delivery work goes out, workflow's waits (given back, not sent).
        more = submit_many([("delivery", PAYLOADS["delivery"])] * 2 + [("workflow", PAYLOADS["workflow"])] * 2)
        _due_now()
        held = loop.run_once()
        assert (held.paused, held.dispatched, held.dead) == (False, 2, 0)
        assert loop.breakers[down_url].pauses == 1, "a paused server is not asked again before its probe"
        assert _pending_uncounted(workflow + [j for j in more if j.domain == "workflow"]) == 6
        assert up.client().llen("rq:queue:delivery") == 9

        # The delivery domain's jobs keep running on their server meanwhile.
        _run_delivery_jobs(up)
        assert Job.objects.filter(domain="delivery", status="succeeded").count() == 9

        # The probe: still down, one envelope is tried, the pause doubles, nothing counts.
        clock.now += 1.0
        _due_now()
        probe = loop.run_once()
        assert probe.dead == 0 and loop.breakers[down_url].seconds_to_probe() == 2.0
        assert loop.breakers[up_url].state == "closed"

        # Back (empty: no persistence): the next probe closes the breaker and the backlog goes out.
        down.start()
        clock.now += 2.0
        _due_now()
        resumed = loop.run_once()
        assert loop.breakers[down_url].state == "closed"
        assert (resumed.breaker.state, resumed.breaker.pauses) == ("closed", 1)
        _due_now()
        loop.run_once()
    finally:
        loop.close()
    assert resumed.dead == 0
    assert DispatchEnvelope.objects.filter(status="dispatched").count() == 6 + 8 + 4
    assert down.client().llen("rq:queue:workflow") == 6


def test_the_rq_side_reads_each_queue_on_its_server_and_one_down_hides_only_its_queues(two_redis):
    from dispatch_app.rq.state import health
    from dispatch_app.rq.state import jobs as rqjobs
    from dispatch_app.rq.state import queues as rqside

    up, down = two_redis
    up.client().rpush("rq:queue:delivery", rq_job_id(1, 1), rq_job_id(2, 1))
    down.client().rpush("rq:queue:workflow", rq_job_id(3, 1))
    snap = rqside.snapshot()
    assert snap["error"] == ""
    assert (snap["domains"]["delivery"]["depth"], snap["domains"]["workflow"]["depth"]) == (2, 1)
    assert rqjobs.job_state(3, 1, "workflow").position == 1  # read on workflow's server

    down.stop()
    snap = rqside.snapshot()
    assert "workflow" not in snap["domains"] and snap["domains"]["delivery"]["depth"] == 2
    assert redis_servers.label(redis_servers.queue_url("workflow")) in snap["error"]
    workers = health.snapshot()
    assert workers["error"].startswith("Redis unavailable (") and "workflow" not in workers["error"]
    assert redis_servers.label(redis_servers.queue_url("workflow")) in workers["error"]
    assert rqjobs.job_state(3, 1, "workflow").error


def test_runworkers_refuses_queues_of_two_servers_and_names_the_runs_to_start_instead():
    from django.core.management import CommandError, call_command

    from dispatch_app.rq.worker.launch import connect, one_server

    queues = {name: dict(entry) for name, entry in settings.RQ_QUEUES.items()}
    other = "unix:///nonexistent/redis.sock?db=0"
    queues["workflow"]["URL"] = other
    with override_settings(RQ_QUEUES=queues):
        with pytest.raises(CommandError) as refused:
            call_command("runworkers", "--queues", "delivery,workflow", "--burst")
        message = str(refused.value)
        assert "delivery, workflow live on 2 Redis servers" in message
        # The test Redis is redis:// on the machine's server and unix:// on the embedded default.
        assert "--queues delivery (on redis://" in message or "--queues delivery (on unix://" in message
        assert "--queues workflow (on unix:///nonexistent" in message
        with pytest.raises(CommandError):
            call_command("runworkers", "--burst")  # every queue: mixed too
        # One server's queues are fine, and the worker connects to that server.
        assert one_server(("workflow",)) == other
        assert connect(("workflow",)).connection_pool.connection_kwargs["path"] == "/nonexistent/redis.sock"
        assert one_server(("delivery", "agent")) == settings.REDIS_URL
