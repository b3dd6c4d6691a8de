"""Security and bad input (issue 6): what a hostile or careless input meets.

- A pickle-serialised job planted in an RQ queue is refused by our workers
  (JSON serializer), not executed; the same plant run by RQ's own worker on its
  default serializer (pickle) does execute, which shows the plant is a real exploit
  (the project's commands run no such worker: test_49_worker_commands.py).
- The admin and its actions need staff plus the specific permissions; an
  action changes state only through the outbox (nothing is pushed to Redis).
- Every management command rejects bad arguments with a clear message and exit
  code 2; ``submit`` rejects bad input and writes nothing.

Deployment (production settings, committed secrets, TLS) is in test_security_deploy.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ValidationError
from django.test import Client

from dispatch_app.models import DispatchEnvelope, Job
from tests.helpers import MANAGE, PYTHON, ROOT

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(180),
    pytest.mark.version_dependent,
    pytest.mark.path_dependent,
]


# --- a planted pickle job ------------------------------------------------------
class _Plant:
    """Unpickling this creates the marker file: arbitrary code run by whoever deserialises it."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


# RQ itself, no Django: a SimpleWorker on RQ's default serializer, draining one queue once (argv: Redis URL, queue).
RQ_PICKLE_WORKER = (
    "import sys, redis; from rq import SimpleWorker; "
    "SimpleWorker([sys.argv[2]], connection=redis.Redis.from_url(sys.argv[1])).work(burst=True)"
)


def plant_pickle_job(conn, queue_name: str, job_id: str, marker: Path) -> None:
    from rq import Queue
    from rq.job import Job as RQJob

    job = RQJob.create(
        "dispatch_app.run.delivery", args=(_Plant(str(marker)), 1), connection=conn, id=job_id
    )  # the default serializer: pickle
    job.save()
    Queue(queue_name, connection=conn).push_job_id(job.id)


def test_a_pickled_job_planted_in_a_queue_is_refused_not_executed(shared_stack, redis_conn):
    stack = shared_stack
    marker = stack.tmp / "pwned-json-worker"
    plant_pickle_job(redis_conn, "delivery", "planted-1", marker)
    # A real job behind it, through the outbox, to show the worker keeps working.
    [real] = stack.submit(1, prefix="real")
    dispatcher = stack.dispatcher()
    stack.wait_all("dispatched", 1, timeout=30, what="envelopes")
    assert dispatcher.stop() == 0

    ours = stack.worker("delivery", burst=True, name="json-worker")
    assert ours.wait(timeout=60) == 0, ours.output()
    assert not marker.exists(), "the planted pickle was deserialised: code ran in our worker"
    assert stack.count_jobs("succeeded") == 1 and stack.ledger() == {(real, 1): 1}
    assert re.search(r"job 'planted-1' refused, not the project's work \(unreadable", ours.output())

    # Control: the same plant, run by RQ's own worker left on its default (pickle) serializer, does run.
    control = stack.tmp / "pwned-pickle-worker"
    plant_pickle_job(redis_conn, "workflow", "planted-2", control)
    pickle_worker = stack.spawn("pickle-worker", [PYTHON, "-c", RQ_PICKLE_WORKER, stack.redis_url, "workflow"])
    pickle_worker.wait(timeout=60)
    assert control.exists(), "control failed: the plant is not an exploit, so the first check proves nothing"


# --- admin -------------------------------------------------------------------
def _user(username: str, *, staff: bool, perms: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(username, password="not-a-secret-pw-123", is_staff=staff)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return User.objects.get(pk=user.pk)


VIEW = ("dispatch_app.view_job", "dispatch_app.view_dispatchenvelope")
JOBS = "/admin/dispatch_app/job/"


@pytest.mark.django_db(transaction=True)
def test_admin_needs_staff_and_the_specific_permission_and_acts_through_the_outbox(redis_conn):
    from dispatch_app.outbox.submit import submit

    job = submit("delivery", {"asset": "a-1", "target": "https://t.example.invalid/1"})
    # Stuck in RQ: dispatched, queued, its RQ job gone.
    DispatchEnvelope.objects.filter(job=job).update(status="dispatched")
    Job.objects.filter(pk=job.pk).update(status="queued")
    action = {"action": "retry_now", "_selected_action": [job.pk]}
    redis_keys = redis_conn.dbsize()

    anonymous = Client()
    assert anonymous.get(JOBS).status_code == 302
    assert anonymous.post(JOBS, action).status_code == 302
    for user, expected in (
        (_user("not-staff", staff=False, perms=VIEW + ("dispatch_app.retry_job",)), 302),
        (_user("staff-no-perms", staff=True), 403),
    ):
        client = Client()
        client.force_login(user)
        assert client.get(JOBS).status_code == expected, user.username
        assert client.post(JOBS, action).status_code == expected, user.username

    viewer = Client()
    viewer.force_login(_user("viewer", staff=True, perms=VIEW))
    page = viewer.get(JOBS)
    assert page.status_code == 200 and "retry_now" not in page.content.decode()
    viewer.post(JOBS, action)
    assert DispatchEnvelope.objects.filter(job=job).count() == 1, "an action ran without its permission"

    operator = Client()
    operator.force_login(_user("operator", staff=True, perms=VIEW + ("dispatch_app.retry_job",)))
    assert "retry_now" in operator.get(JOBS).content.decode()
    page = operator.post(JOBS, action)  # a confirmation page first (issue 12): nothing changes yet
    assert "pf-confirm-retry" in page.content.decode()
    assert DispatchEnvelope.objects.filter(job=job).count() == 1, "retried before the operator confirmed"
    operator.post(JOBS, {**action, "confirmed": "yes"})
    assert list(DispatchEnvelope.objects.filter(job=job).order_by("attempt").values_list("attempt", "status")) == [
        (1, "dispatched"),
        (2, "pending"),
    ], "the action re-dispatches through the outbox"
    assert redis_conn.dbsize() == redis_keys, "the admin pushed to Redis directly"


# --- every command: bad arguments -> exit 2 with a clear message -------------------
COMMANDS = Path(ROOT / "dispatch_app" / "management" / "commands")
BAD_ARGUMENTS = [
    ("rundispatcher", ["--batch-size", "0"], "--batch-size: must be >= 1, got 0"),
    ("rundispatcher", ["--poll-interval", "soon"], "--poll-interval: expected a number, got 'soon'"),
    ("rundispatcher", ["--lease", "-5"], "--lease: must be > 0"),
    ("rundispatcher", ["--domains", "delivry"], "unknown domain(s) delivry"),
    ("rundispatcher", ["--metrics-port", "70000"], "--metrics-port: must be a port number 1-65535, got 70000"),
    ("rundispatcher", ["--no-such-option"], "unrecognized arguments: --no-such-option"),
    ("rundispatcher", [], "DISPATCH['BATCH_SIZE'] must be >= 1", {"DISPATCH_BATCH_SIZE": "0"}),
    ("rundispatcher", [], "is not a setting; did you mean 'BATCH_SIZE'?", {"DISPATCH_BATCH_SIZ": "5"}),
    ("loadgen", [], "the following arguments are required: --count"),
    ("loadgen", ["--count", "ten"], "--count: expected a whole number, got 'ten'"),
    ("loadgen", ["--count", "5", "--domains", "nope"], "unknown domain(s) nope"),
    ("recover", ["--once", "--domain", "nope"], "unknown domain 'nope'"),
    ("recover", [], "the following arguments are required: --once"),
    ("dispatchstats", ["--bogus"], "unrecognized arguments: --bogus"),
    ("dispatchbench", ["--repeat", "0"], "--repeat: must be >= 1, got 0"),
    ("demo", ["--workers", "0"], "--workers: must be >= 1, got 0"),
]


def test_every_command_rejects_bad_arguments_with_exit_code_2(subprocess_env):
    cases = [case for case in BAD_ARGUMENTS if (COMMANDS / f"{case[0]}.py").exists()]
    assert {"rundispatcher"} <= {case[0] for case in cases}
    running = []
    for command, args, message, *extra in cases:
        env = {**subprocess_env, **(extra[0] if extra else {})}
        proc = subprocess.Popen(
            [PYTHON, MANAGE, command, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        running.append((command, args, message, proc))
    problems = []
    for command, args, message, proc in running:
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 2 or message not in err:
            problems.append(f"{command} {args}: exit {proc.returncode}, stderr {err.strip()[-300:]!r}")
    assert problems == []


# --- submit: bad input is refused, nothing written ---------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("domain", "payload", "message"),
    [
        ("nope", {}, "unknown domain 'nope'"),
        ("delivery", ["not", "an", "object"], "payload must be a JSON object"),
        ("delivery", {"asset": "a"}, "delivery.target: required field is missing"),
        ("delivery", {"asset": 1, "target": "t"}, "delivery.asset: expected string, got int"),
        ("delivery", {"asset": "a", "target": "t", "extra": 1}, "unknown field(s) extra"),
        ("delivery", {"asset": "a", "target": float("nan")}, "not JSON-serialisable"),
        ("delivery", {"asset": "a", "target": object()}, "not JSON-serialisable"),
        ("image_series", {"product_id": "p", "prompt": "x", "count": True}, "expected integer, got a boolean"),
        ("delivery", {"asset": "a" * 70_000, "target": "t"}, "over the limit of 65536"),
    ],
    ids=["domain", "not-object", "missing", "type", "unknown-field", "nan", "object", "bool", "oversized"],
)
def test_submit_rejects_bad_input_and_writes_nothing(domain, payload, message):
    from dispatch_app.outbox.submit import JobSpec, submit_many

    good = JobSpec("delivery", {"asset": "a", "target": "t"})
    with pytest.raises(ValidationError) as refused:
        submit_many([good, JobSpec(domain, payload)])
    assert message in str(refused.value)
    assert Job.objects.count() == 0 and DispatchEnvelope.objects.count() == 0
