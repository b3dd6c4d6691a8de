"""locked-head: the oldest pending rows are held by a long transaction.

A separate connection locks the first H candidates (``FOR UPDATE``) and holds
them for the hold time; the dispatcher then starts. ``skip-locked`` (shipped)
passes them over; ``for-update`` (plain ``FOR UPDATE``) queues behind them.
Measured: time from go until every later row is dispatched, and until the head.
"""

from __future__ import annotations

import threading
import time

from bench import Context, record, side_by_side
from bench.load import Child, db_now, dispatch_offsets, pending_count, wait_until
from bench.seed import seed_pending
from bench.stats import ratio

NAME = "locked-head"
VARIANTS = ["skip-locked", "for-update"]
LOCKING = {"skip-locked": "FOR UPDATE SKIP LOCKED", "for-update": "FOR UPDATE"}


def run(ctx: Context) -> list[dict]:
    env = ctx.env
    rows = int(ctx.size("locked_rows", 2000, 200))
    head = int(ctx.size("locked_head", 10, 5))
    hold = ctx.size("locked_hold_s", 3.0, 0.5)

    def run_one(variant: str, index: int):
        env.reset()
        seed_pending(rows)
        locked = threading.Event()
        release = threading.Event()
        head_ids: list[int] = []

        def holder():
            with env.raw(autocommit=False) as conn:
                cur = conn.execute(
                    "SELECT id FROM dispatch_app_dispatchenvelope WHERE status = 'pending' "
                    "ORDER BY available_at, id LIMIT %s FOR UPDATE",
                    [head],
                )
                head_ids.extend(r[0] for r in cur.fetchall())
                locked.set()
                release.wait(60)
                conn.commit()

        thread = threading.Thread(target=holder, daemon=True)
        thread.start()
        locked.wait(30)
        child = Child(
            env,
            {
                "kind": "dispatch",
                "listen": False,
                "poll": 1.0,
                "batch": 100,
                "wait_go": True,
                "locking": LOCKING[variant],
            },
        )
        try:
            t0 = db_now()
            released_at = time.monotonic() + hold
            child.go()
            while time.monotonic() < released_at:
                time.sleep(0.02)
            t_release = db_now() - t0
            release.set()
            thread.join(10)
            wait_until(lambda: pending_count() == 0, timeout=hold + 30, interval=0.05)
        finally:
            release.set()
            child.stop()
        later = dispatch_offsets(t0, "NOT (id = ANY(%s))", [head_ids])
        head_done = dispatch_offsets(t0, "id = ANY(%s)", [head_ids])
        metrics = {
            "later_rows_s": max(later) if len(later) == rows - head else None,
            "head_rows_s": max(head_done) if len(head_done) == head else None,
            "hold_s": t_release,
            "later_dispatched_before_release": sum(1 for x in later if x < t_release),
        }
        return metrics, {}

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    records = [
        record(
            NAME,
            v,
            {"rows": rows, "locked_head": head, "hold_s": hold, "claim": LOCKING[v]},
            out["runs"][v],
            error=out["errors"].get(v),
        )
        for v in VARIANTS
    ]
    base = records[0]["metrics"].get("later_rows_s")
    for rec in records:
        rec["metrics"]["later_x_skip_locked"] = ratio(rec["metrics"].get("later_rows_s"), base)
    return records
