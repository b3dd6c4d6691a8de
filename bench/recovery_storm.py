"""recovery-storm: a backlog of stale work in every domain while new jobs arrive, measured at the job's first line.

Where a user feels it: new delivery jobs committed at a fixed rate (a producer
process, one transaction per 5 ms), measured from the commit's return to the
first line of the job's work (the fault suite's ledger hook, as ``peers``).
One worker process for ``delivery`` and one for the other four queues
(``manage.py runworkers``, each domain queue with its recovery lane), one
dispatcher with its recovery child exactly as ``rundispatcher`` runs them.

The backlog: ``storm_stale_per_domain`` jobs per domain left ``queued`` 1–2 h
ago with no RQ job (Redis lost them): every round re-dispatches its batch of 25
into the domain's recovery lane, and the recovered jobs run on the same workers
as the new ones.

Variants, run interleaved, ``--repeat`` times:

- ``none@R``: no backlog, new jobs at R/s (the baseline of the ratios);
- ``defaults@R``: the backlog, recovery at its defaults (a round per domain
  every 30 s + up to 5 s jitter);
- ``fast@R``: the backlog, a round per domain every second;
- ``unpaced@R``: as ``fast``, with ``RECOVERY_PACING`` off (every round sends its
  whole cap, however slowed new work is): what the pacer saves;
- ``burst@R``: as ``fast``, with ``SPREAD_SECONDS`` = 0 (each round's re-dispatches
  all due at once, as before the spread): what spreading a round saves;
- ``roundfloor@R``: as ``fast``, with the pacer's floor owed every round
  (``RECOVERY_PACE_FLOOR_SECONDS`` = 0, as before it was owed per 30 s): what a floor
  that a round per second does not multiply saves;
- ``loose@R``: as ``fast``, with the pacer's tolerance before 6 Dec 2026
  (``RECOVERY_PACE_TOLERANCE`` 1.25, ``RECOVERY_PACE_SLACK_MS`` 0.5): what the
  tighter default (1.1 and 0.25) saves;
- ``own@R``: as ``fast``, with recovered work on a worker process of its own: the two domain
  workers ``runworkers --new-lanes-only``, a third ``runworkers --queues <every>.recovery
  --nice 10``;
- ``fast, saturated``: the recovery lane of ``delivery`` filled first, then new
  jobs faster than the delivery worker can run them: the share recovered work
  still gets (RECOVERY_LANE_EVERY) is ``recovered_share_pct``.

Reported: new-job commit -> first line p50/p95/p99 and their ratios to
``none`` at the same rate; recovered work's progress: jobs re-dispatched by
recovery and recovered attempts started per minute (all domains and delivery);
and, on the database's clock, where the new jobs' wait went and what ran beside
the slowest of them (``bench.storm_stages``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter

from bench import Context, record, side_by_side
from bench.load import Child, wait_until
from bench.procs import Proc
from bench.seed import seed_stale
from bench.stats import cdf_points, ratio, summarize
from bench.storm_stages import stage_split
from bench.workers import Workers

NAME = "recovery-storm"
RATES = (100, 200)
MODES = ("none", "defaults", "fast", "unpaced", "burst", "roundfloor", "own", "loose")
VARIANTS = [f"{mode}@{r}" for r in RATES for mode in MODES] + ["fast, saturated"]
STALE_SECONDS = 600.0
FAST = {"PERIOD_SECONDS": 1.0, "JITTER_SECONDS": 0.0}


def _stamps(path: str) -> list[tuple[str, int, int, float]]:
    """(domain, job, attempt, time) of every job whose work began, from the ledger hook's file."""
    out = []
    with open(path) as lines:
        for line in lines:
            domain, job_id, attempt, _pid, at = line.split()
            out.append((domain, int(job_id), int(attempt), float(at)))
    return out


def _redispatched(t0: float, t1: float) -> int:
    """Jobs re-dispatched by the recovery rounds that started between two wall times (one host, one clock)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(redispatched), 0) FROM dispatch_app_recoveryround "
            "WHERE started_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
            [t0, t1],
        )
        return int(cursor.fetchone()[0])


def _lane_depth(env, queue: str) -> int:
    return int(env.redis().llen(f"rq:queue:{queue}"))


def run(ctx: Context) -> list[dict]:
    from dispatch_app.domains import lanes
    from dispatch_app.domains.demo_payloads import demo_domain_keys

    env = ctx.env
    domains = list(demo_domain_keys())
    per_domain = int(ctx.size("storm_stale_per_domain", 4000, 60))
    seconds = ctx.size("storm_seconds", 40.0, 1.0)
    saturated_rate = ctx.size("storm_saturated_rate", 800.0, 400.0)
    saturated_backlog = int(ctx.size("storm_saturated_backlog", 300, 25))
    # One rate only (0: every rate) and the saturated run or not: a shorter run of what changed.
    only_rate = int(ctx.size("storm_rate", 0, 0))
    with_saturated = bool(ctx.size("storm_saturated", 1, 1))
    # Leave a mode out (storm_<mode>=0), e.g. the comparisons ``unpaced`` (what pacing saves) and ``burst``.
    left_out = {mode for mode in MODES if mode != "none" and not ctx.size(f"storm_{mode}", 1, 1)}

    def wanted(variant: str) -> bool:
        if variant == "fast, saturated":
            return with_saturated
        if variant.split("@")[0] in left_out:
            return False
        return only_rate in (0, int(variant.split("@")[1]))

    variants = [v for v in VARIANTS if wanted(v)]

    def run_one(variant: str, index: int):
        mode, _, rate_text = variant.partition("@")
        saturated = variant == "fast, saturated"
        rate = saturated_rate if saturated else float(rate_text)
        env.reset()
        if mode != "none":
            seed_stale(per_domain, domains)
        fast = mode.startswith("fast") or mode in ("unpaced", "burst", "roundfloor", "own", "loose")
        overrides = {"QUEUED_STALE_SECONDS": STALE_SECONDS, **(FAST if fast else {})}
        if mode == "burst":
            overrides["SPREAD_SECONDS"] = 0.0
        spec = {
            "kind": "dispatch",
            "listen": True,
            "poll": 1.0,
            "real_recovery": {"domains": domains, "overrides": {d: dict(overrides) for d in domains}},
            "settings": {
                "RECOVERY_PACING": mode != "unpaced",
                **({"RECOVERY_PACE_FLOOR_SECONDS": 0.0} if mode == "roundfloor" else {}),
                # The pacer's tolerance before 6 Dec 2026 (1.25 x the quietest wait + 0.5 ms).
                **({"RECOVERY_PACE_TOLERANCE": 1.25, "RECOVERY_PACE_SLACK_MS": 0.5} if mode == "loose" else {}),
            },
        }
        stamps = tempfile.NamedTemporaryFile(prefix="pf-storm-stamps-", delete=False)
        stamps.close()
        child = Child(env, spec)
        workers: list[Workers] = []
        producer = None
        metrics: dict = {}
        try:
            if saturated:
                # The recovery lane holds work before the new jobs come: the share is then always owed.
                late = lanes.queue_name("delivery", lanes.RECOVERY)
                if not wait_until(lambda: _lane_depth(env, late) >= saturated_backlog, timeout=120, interval=0.1):
                    raise RuntimeError(f"the recovery lane never reached {saturated_backlog} jobs")
            others = [d for d in domains if d != "delivery"]
            own = ("--new-lanes-only",) if mode == "own" else ()
            workers.append(Workers(env, "pipeline", ["delivery"], 1, run_stamps=stamps.name, args=own))
            workers.append(Workers(env, "pipeline", others, 1, run_stamps=stamps.name, args=own))
            if mode == "own":
                late = [lanes.queue_name(d, lanes.RECOVERY) for d in domains]
                workers.append(Workers(env, "pipeline", late, 1, run_stamps=stamps.name, args=("--nice", "10")))
            producer = Proc(["bench.producer", json.dumps({"domain": "delivery"})], env.child_env())
            count = max(5, int(rate * seconds))
            t_go = time.time()
            out = producer.run(120 + count / 20, count=count, rate=rate)
            t_end = time.time()
            committed = {int(k): v for k, v in out["committed"].items()}
            if saturated:
                metrics["new_lane_depth_at_end"] = _lane_depth(env, "delivery")
                metrics["recovery_lane_depth_at_end"] = _lane_depth(env, lanes.queue_name("delivery", lanes.RECOVERY))

            def new_started() -> int:
                return sum(1 for _, j, a, _ in _stamps(stamps.name) if a == 1 and j in committed)

            wait_until(lambda: new_started() >= len(committed), timeout=60 + count / 50, interval=0.2)
            seen = _stamps(stamps.name)
            first = {}
            for domain, job_id, attempt, at in seen:
                if domain == "delivery" and attempt == 1 and job_id in committed:
                    first.setdefault(job_id, at)
            lat = [(first[i] - committed[i]) * 1000 for i in committed if i in first]
            summary = summarize(lat)
            metrics.update(
                {
                    "jobs": len(committed),
                    "missing": len(committed) - len(lat),
                    "achieved_rate": out["jobs"] / out["elapsed"] if out.get("elapsed") else None,
                    **{f"start_{k}_ms": summary[k] for k in ("p50", "p95", "p99", "max")},
                }
            )
            # Recovered work's own progress over the submission window (attempts > 1 whose work began).
            window = max(t_end - t_go, 1e-6)
            recovered = [(d, at) for d, _, a, at in seen if a > 1 and t_go <= at <= t_end]
            by_domain = Counter(d for d, _ in recovered)
            metrics["recovered_started_per_min"] = 60.0 * len(recovered) / window
            metrics["recovered_delivery_started_per_min"] = 60.0 * by_domain["delivery"] / window
            metrics["redispatched"] = _redispatched(t_go, t_end)
            metrics["redispatched_per_min_per_domain"] = 60.0 * metrics["redispatched"] / len(domains) / window
            metrics.update(stage_split(list(first), t_go, t_end))
            if saturated:
                # Of what the delivery worker started while the new jobs came faster than it ran them.
                in_window = [a for d, _, a, at in seen if d == "delivery" and t_go <= at <= t_end]
                late_runs = sum(1 for a in in_window if a > 1)
                metrics["delivery_started_in_window"] = len(in_window)
                metrics["recovered_share_pct"] = 100.0 * late_runs / len(in_window) if in_window else None
            series = {"db_cdf": cdf_points(lat)}
            return metrics, series
        finally:
            if producer is not None:
                producer.stop()
            for w in workers:
                w.stop()
            child.stop()
            os.unlink(stamps.name)

    out = side_by_side(ctx, NAME, variants, run_one)
    params = {
        "stale_per_domain": per_domain,
        "domains": len(domains),
        "seconds": seconds,
        "worker_processes": "1 for delivery, 1 for the other four queues",
        "saturated_rate": saturated_rate,
    }
    records = [
        record(NAME, v, dict(params, variant=v), out["runs"][v], out["series"][v], error=out["errors"].get(v))
        for v in variants
    ]
    by_variant = {r["variant"]: r["metrics"] for r in records}
    for r in RATES:
        base = by_variant.get(f"none@{r}") or {}
        for mode in MODES:
            m = by_variant.get(f"{mode}@{r}")
            if m:
                m["p50_x_none"] = ratio(m.get("start_p50_ms"), base.get("start_p50_ms"))
                m["p99_x_none"] = ratio(m.get("start_p99_ms"), base.get("start_p99_ms"))
    return records
