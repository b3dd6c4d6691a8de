"""Scenario 47: a hostile Redis writer (issue 26.6).

Mixed load over the five domains runs through a dispatcher and two project workers (``runworkers``) while
another process, with nothing but a Redis connection (``hostile_writer``), writes forged jobs of every kind
into every domain queue and every lane: ``os.system`` and a canary function, the project's entry points with
callbacks, dependencies, repeats, retries, keyword arguments, an RQ id the dispatcher would not give, another
domain's entry point, pickled and unreadable hashes; and two real jobs named exactly as the dispatcher would,
one scheduled an hour ahead and one of another domain named through the delivery entry point. Last it plants,
for RQ's maintenance, an unreadable hash in each intermediate list and an abandoned "started" forgery with the
canary as its failure callback; a worker started after it cleans both and keeps running (a clean-clone CI run
once saw a worker end on such a hash).

At the end: the canary file, which any forged call that ran would create, does not exist; every real job
succeeded, each executed once (the execution ledger); the two named real jobs did not start, each with a
``start_refused`` event; every forged job a worker took was refused and counted, and the dashboard (the same
``board.build()`` the page renders) shows the red banner with that count.
"""

from __future__ import annotations

import json
import time

import pytest
import redis

from dispatch_app.domains import lanes
from dispatch_app.rq.deployment import namespace
from dispatch_app.rq.worker import admission
from dispatch_app.views import board
from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.canary import CANARY_ENV
from tests.helpers import PYTHON, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

DOMAINS = ("workflow", "image_series", "delivery", "partial_edit", "agent")
PAYLOADS = {
    "image_series": lambda i: {"product_id": f"p{i}", "prompt": f"shot {i}", "count": 2, "size": 8},
    "agent": lambda i: {"goal": f"caption {i}", "max_steps": 2},
    "partial_edit": lambda i: {"image": f"img-{i}", "region": [0, 0, 8, 8], "instruction": "brighter"},
    "workflow": lambda i: {"workflow_id": f"wf-{i}", "steps": ["fetch", "tag"]},
    "delivery": lambda i: {"asset": f"a-{i}", "target": f"https://target.example.invalid/{i}"},
}
LOAD_ROUNDS = 12  # one job per domain per round
WRITER_ROUNDS = 8  # forgeries per queue and lane per round: 12


def test_a_hostile_redis_writer_runs_nothing_and_real_jobs_finish_once(shared_stack):
    stack = shared_stack
    started = time.monotonic()
    canary = stack.tmp / "canary"
    env = {CANARY_ENV: str(canary), "DISPATCH_PROVIDER_LATENCY_MS": 2, "DISPATCH_PROVIDER_FAILURE_RATE": 0}
    stack.dispatcher("--poll-interval", "1", **env)
    workers = [stack.worker(*DOMAINS, name=f"worker{i}", **env) for i in range(2)]

    # Two real jobs, scheduled an hour ahead: the writer names them by the RQ id the dispatcher would give them.
    [ahead] = stack.submit(1, domain="delivery", delay=3600, payloads=[PAYLOADS["delivery"](-1)])
    [other] = stack.submit(1, domain="image_series", delay=3600, payloads=[PAYLOADS["image_series"](-1)])
    queues = [queue for domain in DOMAINS for queue in lanes.queues(domain)]
    summary = stack.tmp / "forged.json"
    writer = stack.spawn(
        "hostile-writer",
        [PYTHON, "-m", "tests.acceptance.faults.hostile_writer", stack.redis_url, str(summary), str(canary)]
        + [str(WRITER_ROUNDS), *queues, "--", f"delivery:delivery:{ahead}", f"delivery:delivery:{other}"],
        PF_NAMESPACE=namespace(),
    )

    real: list[int] = []
    for i in range(LOAD_ROUNDS):
        for domain in DOMAINS:
            real += stack.submit(1, domain=domain, payloads=[PAYLOADS[domain](i)])
        time.sleep(0.25)
    assert writer.wait(timeout=60) == 0, writer.output()[-3000:]
    summary = json.loads(summary.read_text())
    written, planted = summary["written"], summary["planted"]
    # A worker started now runs RQ's maintenance over what was planted for it: it drops the unreadable hashes and
    # fails the abandoned forgeries through RQ's own code, never importing their callback, and keeps running.
    workers.append(stack.worker(*DOMAINS, name="late-worker", **env))
    stack.wait_all("succeeded", len(real), timeout=60)

    conn = redis.Redis.from_url(stack.redis_url)
    wait_until(
        lambda: (
            stack.check_alive()
            or all(
                conn.lpos(f"rq:queue:{q}:intermediate", ids["unreadable"]) is None
                and conn.zscore(f"rq:failed:{q}", ids["abandoned"]) is not None
                for q, ids in planted.items()
            )
        ),
        timeout=30,
        message="the late worker's maintenance dropped every unreadable hash and failed every abandoned forgery",
    )
    # A worker given a domain queue listens on its lanes too (dispatch_app.domains.lanes).
    taken_by_workers = {lane for q in _served(workers) for lane in (lanes.queues(q) if q in DOMAINS else (q,))}
    wait_until(
        lambda: stack.check_alive() or all(conn.llen(f"rq:queue:{q}") == 0 for q in taken_by_workers),
        timeout=30,
        message="every forged job in a queue the workers serve was taken",
    )
    left = sum(conn.llen(f"rq:queue:{q}") for q in queues)  # a lane no worker serves keeps its forgeries
    # Nothing forged ran: not os.system, not the canary as a function, a callback or a pickled call.
    assert not canary.exists(), canary.read_text()

    # Every real job succeeded and ran once; the two named ones neither started nor ran, and their rows say
    # nothing happened to them: no dispatch, no start (a start made ahead of the take is withdrawn to where it was).
    report = invariants.check_stack(
        stack, expected_jobs=len(real) + 2, expect_status={"succeeded": len(real), "submitted": 2}
    )
    untouched = stack.sql(
        "SELECT id FROM dispatch_app_job WHERE id = ANY(%s) AND dispatched_at IS NULL AND started_at IS NULL",
        ([ahead, other],),
    )
    assert sorted(r[0] for r in untouched) == sorted([ahead, other])

    # Every forged job a worker took was refused and counted where the dashboard reads it: the two named with
    # the dispatcher's ids too, unsigned (dispatch_app.rq.ids), before anything of them was read or run.
    totals = admission.totals(conn)
    expected = sum(written.values()) - left
    assert totals["count"] == expected, (totals, written, left)
    assert totals["kinds"].get(admission.UNSIGNED, 0) >= 2, totals
    assert set(totals["kinds"]) == set(admission.KINDS), totals
    banners = {b["key"]: b for b in board.build()["banners"]}
    assert banners["refused-jobs"]["level"] == "error"
    assert banners["refused-jobs"]["text"].startswith(f"{expected} jobs refused: not the project's work, last: ")
    for proc in workers:
        assert proc.alive(), proc.output()[-3000:]
    seconds = time.monotonic() - started
    record_figures(
        "47_hostile_redis_writer",
        real_jobs=len(real),
        forged_jobs=sum(written.values()),
        refused=totals["count"],
        refused_by_kind=totals["kinds"],
        left_in_unserved_lanes=left,
        seconds=round(seconds, 1),
        **report.figures(),
    )
    assert seconds < 90, f"the scenario took {seconds:.0f} s"


def _served(workers) -> set[str]:
    """The queues the workers were started on (runworkers --queues a,b,...)."""
    served: set[str] = set()
    for proc in workers:
        args = proc.popen.args
        served |= set(args[args.index("--queues") + 1].split(","))
    return served
