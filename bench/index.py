"""index: claim rate and plan, partial ``(available_at, id) WHERE status='pending'`` vs composite
``(status, available_at, id)``, on a table where most envelopes are dispatched.

One table is seeded once (default 300k dispatched + 10k pending); each run
swaps the index, re-arms the same 10k rows, VACUUM ANALYZEs, captures the
claim's plan (EXPLAIN ANALYZE, BUFFERS) and then claims + marks batches of 100
until none is pending (no Redis: the database's share only).
"""

from __future__ import annotations

import time

from bench import Context, record, side_by_side
from bench.seed import seed_pending
from bench.stats import rate, ratio, summarize

NAME = "index"
VARIANTS = ["partial", "composite"]
ENVELOPE = "dispatch_app_dispatchenvelope"
COMPOSITE = "bench_envelope_status_available_id"

PICK_SQL = f"""
SELECT id FROM {ENVELOPE}
WHERE status = 'pending' AND available_at <= clock_timestamp()
ORDER BY available_at, id LIMIT 100 FOR UPDATE SKIP LOCKED
"""


def _use(cursor, variant: str) -> str:
    cursor.execute(f"DROP INDEX IF EXISTS envelope_claim; DROP INDEX IF EXISTS {COMPOSITE}")
    if variant == "partial":
        cursor.execute(f"CREATE INDEX envelope_claim ON {ENVELOPE} (available_at, id) WHERE status = 'pending'")
        return "envelope_claim"
    cursor.execute(f"CREATE INDEX {COMPOSITE} ON {ENVELOPE} (status, available_at, id)")
    return COMPOSITE


def _walk(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _walk(child)


def run(ctx: Context) -> list[dict]:
    from django.db import connection

    from dispatch_app.store import claim

    env = ctx.env
    dispatched = int(ctx.size("index_dispatched", 300_000, 5_000))
    pending = int(ctx.size("index_pending", 10_000, 500))
    env.reset()
    seed_pending(dispatched, envelope_status="dispatched")
    first, last = seed_pending(pending)

    def run_one(variant: str, index: int):
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 0")
            index_name = _use(cursor, variant)
            cursor.execute(
                f"UPDATE {ENVELOPE} SET status = 'pending', dispatched_at = NULL, lease_token = NULL, "
                "available_at = clock_timestamp() - interval '1 second', send_attempts = 0 "
                "WHERE job_id BETWEEN %s AND %s",
                [first, last],
            )
            cursor.execute(f"VACUUM ANALYZE {ENVELOPE}")
            cursor.execute("SELECT pg_relation_size(%s::regclass)", [index_name])
            index_bytes = cursor.fetchone()[0]
            cursor.execute("BEGIN")
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + PICK_SQL)
            explain = cursor.fetchone()[0]
            cursor.execute("ROLLBACK")
            cursor.execute("RESET statement_timeout")
        explain = explain[0] if isinstance(explain, list) else explain
        nodes = list(_walk(explain["Plan"]))
        scan = next((n for n in nodes if "Index Name" in n or "Scan" in n["Node Type"]), nodes[-1])
        claim_ms = []
        done = 0
        started = time.monotonic()
        while True:
            t = time.monotonic()
            batch = claim.claim_batch(100, 30.0)
            claim_ms.append((time.monotonic() - t) * 1000)
            if not batch.envelopes:
                break
            done += claim.mark_dispatched([e.envelope_id for e in batch.envelopes], batch.token)
        elapsed = time.monotonic() - started
        summary = summarize(claim_ms[:-1] or claim_ms)
        metrics = {
            "envelopes": done,
            "envelopes_per_s": rate(done, elapsed),
            "claim_p50_ms": summary["p50"],
            "claim_p99_ms": summary["p99"],
            "plan_ms": explain.get("Execution Time"),
            "plan_node": f"{scan['Node Type']} using {scan.get('Index Name', '-')}",
            "plan_shared_hit": sum(n.get("Shared Hit Blocks", 0) for n in nodes[:1]),
            "plan_sort": any(n["Node Type"] == "Sort" for n in nodes),
            "index_mb": index_bytes / 2**20,
        }
        return metrics, {}

    try:
        out = side_by_side(ctx, NAME, VARIANTS, run_one)
    finally:
        with connection.cursor() as cursor:
            _use(cursor, "partial")
        env.reset()
    records = [
        record(
            NAME,
            v,
            {"dispatched_rows": dispatched, "pending_rows": pending, "batch": 100},
            out["runs"][v],
            error=out["errors"].get(v),
        )
        for v in VARIANTS
    ]
    base = records[0]["metrics"].get("envelopes_per_s")
    for rec in records:
        rec["metrics"]["x_partial"] = ratio(rec["metrics"].get("envelopes_per_s"), base)
    return records
