"""Scenario 49: forged jobs through every worker command this project has (issue 56).

Forged jobs wait in the ``delivery`` queue and its recovery lane: a call of ``os.system`` and of the canary
function (``tests.canary.touch``) on JSON, the project's entry point with a canary callback, a pickled call of the
canary, and a canary call whose ``meta`` is a pickle that creates a marker file when read.
Then, as separate processes, django-rq's worker commands as the README once named them: ``rqworker delivery``,
``rqworker delivery --serializer rq.serializers.JSONSerializer``, ``rqworker --worker-class
dispatch_app.rqworker.PipelineWorker delivery``, ``rqworker-pool delivery``, the recovery lane alone, and no queue
(django-rq's ``"default"``, a task queue here). Each refuses to start with one line naming ``manage.py
runworkers`` and takes nothing: every forged job is still queued, no canary, no marker. A project listing
``django_rq`` before ``dispatch_app`` gets django-rq's own ``rqworker``: the system check ``dispatch_app.E021``
stops it before it reads anything. Last ``runworkers --burst`` on the same plants refuses every one of them at
admission and runs nothing.
"""

from __future__ import annotations

import pickle

import pytest
import redis
from rq import Callback, Queue
from rq.serializers import JSONSerializer

from dispatch_app.domains import lanes
from dispatch_app.rq.worker import admission
from tests.acceptance.faults.infra import SITE_DIR, record_figures
from tests.canary import CANARY_ENV
from tests.helpers import MANAGE, PYTHON, ROOT

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

CANARY = "tests.canary.touch"
LANES = lanes.queues("delivery")
BURST = ("--burst",)  # had a command run a worker, it would drain the queues and exit, not hang the test
COMMANDS = {
    "rqworker": ["rqworker", "delivery", *BURST],
    "rqworker-json": ["rqworker", "delivery", "--serializer", "rq.serializers.JSONSerializer", *BURST],
    "rqworker-pipeline": ["rqworker", "--worker-class", "dispatch_app.rqworker.PipelineWorker", "delivery", *BURST],
    "rqworker-pool": ["rqworker-pool", "delivery", *BURST],
    "rqworker-lane": ["rqworker", "delivery.recovery", "--worker-class", "rq.worker.SimpleWorker", *BURST],
    "rqworker-default": ["rqworker", *BURST],
}


# This repository's settings with django_rq listed before dispatch_app: `rqworker` is then django-rq's own.
WRONG_ORDER = """
from productflow.settings import *  # noqa: F403
from productflow.settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [a for a in _APPS if a != "dispatch_app"]
INSTALLED_APPS.insert(INSTALLED_APPS.index("django_rq") + 1, "dispatch_app")
"""


class _Plant:
    """Unpickling this creates the marker file: arbitrary code run by whoever deserialises it."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant(conn: redis.Redis, canary, markers) -> int:
    """Forged jobs in both lanes of ``delivery``; how many."""
    written = 0
    for queue in LANES:
        q = Queue(queue, connection=conn, serializer=JSONSerializer)
        q.enqueue("os.system", f"touch {canary}")
        q.enqueue(CANARY, "direct")
        q.enqueue("dispatch_app.run.delivery", 10**9, 1, on_success=Callback(CANARY), on_failure=Callback(CANARY))
        Queue(queue, connection=conn).enqueue(CANARY, "pickled")  # RQ's default serializer: pickle
        # The canary on JSON, its meta a pickle: read with pickle, the meta alone runs code.
        job = q.enqueue(CANARY, "meta")
        conn.hset(job.key, "meta", pickle.dumps(_Plant(str(markers / f"meta-{queue}"))))
        written += 5
    return written


def queued(conn: redis.Redis) -> int:
    return sum(conn.llen(f"rq:queue:{queue}") for queue in LANES)


def test_every_worker_command_runs_nothing_forged(shared_stack):
    stack = shared_stack
    canary, markers = stack.tmp / "canary", stack.tmp / "markers"
    markers.mkdir()
    conn = redis.Redis.from_url(stack.redis_url)
    written = plant(conn, canary, markers)
    waiting = queued(conn)
    env = {CANARY_ENV: str(canary)}

    refused = {name: stack.spawn(name, [PYTHON, MANAGE, *argv], **env) for name, argv in COMMANDS.items()}
    (stack.tmp / "wrong_order_settings.py").write_text(WRONG_ORDER)
    django_rqs = stack.spawn(
        "django-rq-first",
        [PYTHON, MANAGE, *COMMANDS["rqworker"]],
        DJANGO_SETTINGS_MODULE="wrong_order_settings",
        PYTHONPATH=f"{stack.tmp}:{SITE_DIR}:{ROOT}",
        **env,
    )
    for name, proc in refused.items():
        code = proc.wait(timeout=60)
        lines = [line for line in proc.output().splitlines() if line.strip()]
        assert code != 0 and len(lines) == 1, f"{name}: exit {code}\n{proc.output()[-2000:]}"
        assert "refuses the project's queues" in lines[0] and "'manage.py runworkers'" in lines[0], lines
    assert django_rqs.wait(timeout=60) != 0, django_rqs.output()[-2000:]
    assert "(dispatch_app.E021) 'django_rq' is listed before 'dispatch_app'" in django_rqs.output()
    assert queued(conn) == waiting, "a refused command took jobs"
    assert not canary.exists() and list(markers.iterdir()) == []

    # The project's worker: every forged job taken and refused at admission, nothing run, nothing unpickled.
    ours = stack.worker("delivery", name="runworkers", burst=True, **env)
    assert ours.wait(timeout=90) == 0, ours.output()[-3000:]
    assert queued(conn) == 0
    assert not canary.exists(), canary.read_text()
    assert list(markers.iterdir()) == []
    totals = admission.totals(conn)
    assert totals["count"] == written, (totals, written)
    record_figures("49_worker_commands", forged_jobs=written, refused=totals["count"], commands=sorted(COMMANDS))
