"""The project's worker (``manage.py runworkers``, PipelineWorker) as real processes on real Redis and PostgreSQL.

- kill -9 mid-job: RQ's registries stay true, recovery's evidence says "started on a
  dead worker", the jobs the dead worker had taken but not started go back to the
  queue, and nothing runs twice per attempt;
- SIGTERM mid-job: the job finishes, taken jobs go back, exit 0;
- a Redis outage: the worker waits, reconnects and resumes (RQ's worker exits 1);
- a job the worker cannot deserialize: failed visibly, reported loudly once, and the
  worker shows as failing every job;
- --max-jobs: worker processes are recycled;
- the project's dashboard and ``rq info`` list the worker and its jobs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from rq import Queue
from rq.job import Job as RQJob
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.worker import Worker

from dispatch_app.recovery.evidence import rq_job_status, worker_alive
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.state import health
from tests.helpers import MANAGE, PYTHON, ROOT, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180), pytest.mark.version_dependent]

FAST_BEAT = {"DISPATCH_WORKER_HEARTBEAT_INTERVAL": 0.5}  # the worker hash expires 3 s after a kill


def gated_worker(stack, gate: Path, *queues: str, name: str = "gated-worker", **env):
    gate.mkdir(exist_ok=True)
    argv = [PYTHON, "-m", "tests.acceptance.faults.worker_gate", "runworkers", "--processes", "1"]
    argv += ["--queues", ",".join(queues or ("delivery",))]
    return stack.spawn(name, argv, PF_WORKER_GATE=str(gate), **env)


def entered(gate: Path) -> int:
    return len(list(gate.glob("entered-*")))


def worker_names(conn) -> list[str]:
    return [w.name for w in Worker.all(connection=conn)]


def test_kill_9_mid_job_leaves_true_registries_and_dead_worker_evidence(private_redis_stack, private_redis):
    stack = private_redis_stack
    conn = private_redis.client()
    ids = stack.submit(4, prefix="k9")
    dispatcher = stack.dispatcher()
    stack.wait_all("dispatched", 4, timeout=30, what="envelopes")
    gate = stack.tmp / "gate"
    doomed = gated_worker(stack, gate, **FAST_BEAT)
    wait_until(lambda: entered(gate) == 1, timeout=60, message="the worker inside its first job")
    [name] = worker_names(conn)
    [(running, _)] = [key for key, n in stack.ledger().items() if n]
    others = sorted(set(ids) - {running})
    doomed.send(signal.SIGKILL)
    doomed.wait(timeout=10)

    # What recovery reads: the attempt started on that worker, and the worker is gone once its hash expires.
    assert rq_job_status(running, 1, conn) == ("started", name)
    assert stack.scalar("SELECT status FROM dispatch_app_job WHERE id = %s", [running]) == "running"
    wait_until(lambda: worker_alive(name, conn) is False, timeout=20, message="the killed worker's hash to expire")
    # Its execution is still in the started registry (RQ fails it once its TTL passes), and the
    # jobs it had taken but not started wait in the intermediate list, still queued.
    started = StartedJobRegistry("delivery", connection=conn)
    assert started.get_job_ids(cleanup=False) == [rq_job_id(running, 1)]
    taken = [i.decode() for i in conn.lrange("rq:queue:delivery:intermediate", 0, -1)]
    assert sorted(taken) == sorted(rq_job_id(j, 1) for j in others)
    assert {RQJob.fetch(t, connection=conn).get_status() for t in taken} == {"queued"}

    recovered = stack.manage(
        "recover", "--once", "--json", DISPATCH_RECOVERY=json.dumps({"delivery": {"RUNNING_STALE_SECONDS": 0}})
    )
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    reason = stack.scalar(
        "SELECT reason FROM dispatch_app_jobevent WHERE job_id = %s ORDER BY at DESC, id DESC LIMIT 1", [running]
    )
    assert f"started on {name}, which is gone" in reason, reason

    # A new worker gives the dead worker's taken jobs back to the queue and runs everything once.
    successor = stack.worker("delivery", name="successor", **FAST_BEAT)
    stack.wait_all("succeeded", 4, timeout=60)
    assert "went back to their queues" in successor.output()
    assert stack.ledger() == {(running, 1): 1, (running, 2): 1, **{(j, 1): 1 for j in others}}
    assert successor.stop() == 0
    assert dispatcher.stop() == 0

    # The registries end true: finished jobs in the finished registry, nothing queued or taken,
    # the dead worker gone from RQ's worker set, its execution failed by RQ's own cleanup after its TTL.
    finished = FinishedJobRegistry("delivery", connection=conn).get_job_ids()
    assert sorted(finished) == sorted(rq_job_id(j, 1) for j in others)
    # The re-dispatched attempt went through the recovery lane (dispatch_app.domains.lanes) and finished there.
    assert FinishedJobRegistry("delivery.recovery", connection=conn).get_job_ids() == [rq_job_id(running, 2)]
    for lane in ("delivery", "delivery.recovery"):
        assert conn.llen(f"rq:queue:{lane}") == 0 and conn.llen(f"rq:queue:{lane}:intermediate") == 0
    assert name not in worker_names(conn)
    started.cleanup(timestamp=time.time() + 10_000)
    assert started.get_job_ids() == []
    assert FailedJobRegistry("delivery", connection=conn).get_job_ids() == [rq_job_id(running, 1)]


def test_sigterm_mid_job_finishes_it_and_gives_back_the_taken_jobs(shared_stack, redis_conn):
    stack = shared_stack
    ids = stack.submit(3, prefix="term")
    dispatcher = stack.dispatcher()
    stack.wait_all("dispatched", 3, timeout=30, what="envelopes")
    gate = stack.tmp / "gate"
    worker = gated_worker(stack, gate)
    wait_until(lambda: entered(gate) == 1, timeout=60, message="the worker inside its first job")
    [(first, _)] = list(stack.ledger())
    worker.send(signal.SIGTERM)
    (gate / "release").write_text("")
    assert worker.wait(timeout=30) == 0, worker.output()

    assert stack.scalar("SELECT status FROM dispatch_app_job WHERE id = %s", [first]) == "succeeded"
    rest = sorted(set(ids) - {first})
    assert stack.sql("SELECT id FROM dispatch_app_job WHERE status = 'queued' ORDER BY id") == [(j,) for j in rest]
    assert [i.decode() for i in redis_conn.lrange("rq:queue:delivery", 0, -1)] == [rq_job_id(j, 1) for j in rest]
    assert redis_conn.llen("rq:queue:delivery:intermediate") == 0
    assert "warm shutdown requested" in worker.output()
    assert worker.output().count("start-up objects frozen") == 1  # runtime.gcfreeze: one process, no pool

    drain = stack.worker("delivery", burst=True, name="drain")
    assert drain.wait(timeout=60) == 0, drain.output()
    assert stack.count_jobs("succeeded") == 3
    assert stack.ledger() == {(j, 1): 1 for j in ids}
    assert dispatcher.stop() == 0


def test_a_redis_outage_does_not_end_the_worker(private_redis_stack, private_redis):
    stack = private_redis_stack
    dispatcher = stack.dispatcher(
        DISPATCH_SEND_BACKOFF_BASE=0.2, DISPATCH_SEND_BACKOFF_MAX=1, DISPATCH_MAX_SEND_ATTEMPTS=1000
    )
    worker = stack.worker("delivery", DISPATCH_RECONNECT_BACKOFF_MAX=1, **FAST_BEAT)
    stack.submit(5, prefix="before")
    stack.wait_all("succeeded", 5, timeout=60)

    private_redis.stop()
    wait_until(lambda: "Redis unavailable" in worker.output(), timeout=30, message="the worker to see the outage")
    assert worker.alive()
    private_redis.start()
    wait_until(lambda: "Redis is back; resuming" in worker.output(), timeout=30, message="the worker to reconnect")
    stack.submit(5, prefix="after")
    stack.wait_all("succeeded", 10, timeout=60)
    assert worker.alive(), worker.output()
    # Redis came back empty: the worker registered itself again and dashboards see it.
    assert len(worker_names(private_redis.client())) == 1
    assert worker.stop() == 0
    assert dispatcher.stop() == 0
    assert set(stack.ledger().values()) == {1}


def plant_pickled_job(conn, job_id: str) -> None:
    """A job enqueued with RQ's default serializer (pickle): our JSON worker cannot read it."""
    job = RQJob.create("dispatch_app.run.delivery", args=(1, 1), connection=conn, id=job_id, origin="delivery")
    job.save()
    Queue("delivery", connection=conn).push_job_id(job.id)


def test_undeserializable_jobs_fail_visibly_and_are_reported_loudly_once(shared_stack, redis_conn):
    stack = shared_stack
    plant_pickled_job(redis_conn, "planted-1")
    plant_pickled_job(redis_conn, "planted-2")
    worker = stack.worker("delivery", name="json-worker")
    failed = FailedJobRegistry("delivery", connection=redis_conn)
    wait_until(lambda: len(failed) == 2, timeout=60, message="both planted jobs failed")
    out = worker.output()
    # Refused before anything is imported (rqworker.admission): loud once, one line each after that.
    refused = [line for line in out.splitlines() if "refused, not the project's work (unreadable" in line]
    assert len(refused) == 2 and [" ERROR " in line for line in refused] == [True, False], out
    for job_id in ("planted-1", "planted-2"):
        assert RQJob.fetch(job_id, connection=redis_conn).get_status() == "failed"

    [row] = health.workers(redis_conn)
    assert (row.undeserializable, row.failed, row.successful, row.failing_every_job) == (2, 2, 0, True)
    assert "planted-2: cannot deserialize" in row.last_error
    stats = subprocess.run(
        [PYTHON, MANAGE, "dispatchstats"], cwd=ROOT, env=stack.env(), capture_output=True, text=True, timeout=60
    )
    assert "FAILING EVERY JOB" in stats.stdout, stats.stdout + stats.stderr
    assert worker.stop() == 0


def test_max_jobs_recycles_worker_processes(shared_stack):
    stack = shared_stack
    ids = stack.submit(5, prefix="recycle")
    dispatcher = stack.dispatcher()
    pool = stack.spawn(
        "pool", [PYTHON, MANAGE, "runworkers", "--queues", "delivery", "--processes", "1", "--max-jobs", "2"]
    )
    stack.wait_all("succeeded", 5, timeout=90)
    ledger = stack.tmp / "executions.ledger"
    pids = {line.split()[3] for line in ledger.read_text().splitlines()}
    assert len(pids) >= 3, f"5 jobs at 2 per process need 3 processes, ran in {pids}"
    assert stack.ledger() == {(j, 1): 1 for j in ids}
    assert pool.output().count("exiting (--max-jobs)") >= 2
    # runtime.gcfreeze: the pool's parent before forking, and every worker process after its set-up.
    assert pool.output().count("start-up objects frozen") >= 1 + len(pids), pool.output()
    assert pool.stop() == 0
    assert dispatcher.stop() == 0


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_and_rq_info_list_the_worker_and_its_jobs(shared_stack, redis_conn, client):
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.urls import reverse

    stack = shared_stack
    [job_id] = stack.submit(1, prefix="shown")
    dispatcher = stack.dispatcher()
    gate = stack.tmp / "gate"
    worker = gated_worker(stack, gate)
    wait_until(lambda: entered(gate) == 1, timeout=60, message="the worker inside the job")
    [name] = worker_names(redis_conn)
    rq_id = rq_job_id(job_id, 1)

    info = subprocess.run(
        [str(Path(PYTHON).parent / "rq"), "info", "--url", settings.REDIS_URL, "delivery"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert info.returncode == 0, info.stderr
    assert name in info.stdout and "busy" in info.stdout, info.stdout
    [seen] = Worker.all(connection=redis_conn)
    assert (seen.name, seen.get_state(), seen.queue_names(), seen.get_current_job_id()) == (
        name,
        "busy",
        ["delivery", "delivery.recovery"],  # a domain queue brings its recovery lane (dispatch_app.domains.lanes)
        rq_id,
    )

    # The operators' view of RQ is the project's dashboard (django-rq's own views are not mounted: they read
    # hashes with pickle, tests/integration/admin/test_admin_no_pickle.py).
    client.force_login(User.objects.create_superuser("rq-admin", password="not-a-secret-pw-123"))
    data_url = reverse("admin:dispatch_app_dashboard_json")

    def shown() -> dict:
        response = client.get(data_url)
        assert response.status_code == 200
        [row] = [w for w in response.json()["rq"]["workers"] if w["name"] == name]
        return row

    row = shown()
    assert (row["state"], row["current_job"], row["alive"]) == ("busy", rq_id, True), row
    assert client.get("/admin/django_rq/dashboard/").status_code == 404

    (gate / "release").write_text("")
    stack.wait_all("succeeded", 1, timeout=30)
    wait_until(lambda: rq_id in FinishedJobRegistry("delivery", connection=redis_conn), timeout=10, message="RQ end")
    [seen] = Worker.all(connection=redis_conn)
    assert seen.successful_job_count == 1 and seen.get_current_job_id() is None
    row = shown()
    assert (row["successful"], row["current_job"]) == (1, ""), row
    assert worker.stop() == 0
    assert dispatcher.stop() == 0
