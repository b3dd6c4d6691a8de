"""isolation: new jobs arrive steadily while one domain's recovery round blocks >= 2 s in the database.

Variants (same arrival rate, same dispatcher process shape):
- ``unloaded``: independent loops, no recovery running (the baseline p99);
- ``independent``: the shipped shape, every recovery loop on its own thread and
  connection; one domain's round holds its candidates' row locks in a
  ``pg_sleep`` for the block time;
- ``recovery process``: the default deployment of ``rundispatcher``: the same
  recovery loops in their own process at nice +10, its sessions committing
  asynchronously (runtime.recovery_child.recovery_sessions), its rounds
  yielding to an outbox backlog (runtime.yielding), the dispatcher
  process runs none (the blocked round is the same);
- ``recovery process, as before``: the same as it was before its commits were
  asynchronous and its rounds yielded to an outbox backlog;
- ``serial``: the seed's shape, recover (all domains) then dispatch then wait,
  in one loop: new jobs wait behind the blocked round.
"""

from __future__ import annotations

from bench import Context, record, side_by_side
from bench.load import latency_run
from bench.seed import seed_stale
from bench.stats import ratio

NAME = "isolation"
VARIANTS = ["unloaded", "independent", "recovery process", "recovery process, as before", "serial"]
BLOCKED_DOMAIN = "image_series"


def run(ctx: Context) -> list[dict]:
    from dispatch_app.domains.demo_payloads import (
        demo_domain_keys as domain_keys,  # the shipped five (a demo payload each)
    )

    env = ctx.env
    rate = ctx.size("isolation_rate", 200.0, 200.0)
    seconds = ctx.size("isolation_seconds", 5.0, 0.6)
    block = ctx.size("isolation_block_s", 2.0, 0.3)
    period = ctx.size("isolation_period_s", 2.5, 0.4)
    stale = ctx.size("isolation_stale_per_domain", 200, 20)

    def run_one(variant: str, index: int):
        env.reset()
        seed_stale(int(stale), list(domain_keys()))
        spec = {"kind": "serial" if variant == "serial" else "dispatch", "listen": True, "poll": 1.0}
        extra_specs = []
        if variant != "unloaded":
            recovery = {
                "domains": list(domain_keys()),
                "period": period,
                "batch": 25,
                "block_domains": {BLOCKED_DOMAIN: block},
            }
            if variant.startswith("recovery process"):
                extra_specs.append(
                    {
                        "kind": "recovery-only",
                        "nice": 10,
                        "recovery": recovery,
                        "listen": False,
                        "recovery_sync_commit": "as before" in variant,
                        "recovery_no_yield": "as before" in variant,
                    }
                )
            else:
                spec["recovery"] = recovery
        metrics, series, child = latency_run(
            env, spec, rate=rate, count=int(rate * seconds), settle=block + 5, extra_specs=extra_specs
        )
        rec = child.stats.get("recovery", {}) if not extra_specs else child.stats["extra"][0].get("recovery", {})
        metrics["recovery_rounds"] = sum(d["rounds"] for d in rec.values())
        metrics["blocked_round_max_s"] = rec.get(BLOCKED_DOMAIN, {}).get("round_seconds_max")
        metrics["cpu_dispatcher_s"] = child.stats.get("cpu_self_s")
        metrics["cpu_recovery_process_s"] = sum(e.get("cpu_self_s", 0) for e in child.stats.get("extra", []))
        return metrics, series

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    params = {
        "rate_per_s": rate,
        "seconds": seconds,
        "block_s": block,
        "recovery_period_s": period,
        "blocked_domain": BLOCKED_DOMAIN,
        "stale_jobs_per_domain": int(stale),
    }
    records = [
        record(NAME, v, dict(params, design=v), out["runs"][v], out["series"][v], error=out["errors"].get(v))
        for v in VARIANTS
    ]
    base = records[0]["metrics"].get("db_p99_ms")
    for rec in records:
        if rec["metrics"]:
            rec["metrics"]["p99_x_unloaded"] = ratio(rec["metrics"].get("db_p99_ms"), base)
    return records
