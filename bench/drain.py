"""drain: a backlog of pending envelopes; continue-on-full vs wait-for-tick; one vs two processes.

- ``continue B=100`` / ``continue B=500``: the shipped loop, claiming the next
  batch at once while the last was full, over the big backlog (default 100k);
- ``two-procs B=500``: two dispatcher processes (real subprocesses) sharing it;
- ``tick B=100`` / ``tick B=500``: the seed's drain, one batch per 1 s tick.
  A 100k backlog would take K*I = 1000 s at B=100, so the tick variants drain a
  backlog of K batches (default 6) and are compared with ``continue`` on the
  same K: measured extra wait vs the predicted (K-1)*I.
- ``publish-only B=500``: the ceiling without the database: the same Publisher,
  BoundedSender and chunking sending the backlog's worth of synthetic envelopes
  straight to Redis (RQ job construction + pipelines only), in the bench process.

Drain time is from the DB clock at "go" to the last ``dispatched_at``.
"""

from __future__ import annotations

from bench import Context, record, side_by_side
from bench.load import Child, db_now, dispatch_offsets, pending_count, wait_until
from bench.seed import seed_pending
from bench.stats import batches_for, cumulative_progress, predicted_tick_wait, rate

NAME = "drain"
VARIANTS = [
    "continue B=100",
    "continue B=500",
    "two-procs B=500",
    "tick B=100",
    "tick B=500",
    "continue-small B=100",
    "continue-small B=500",
    "publish-only B=500",
]
TICK = 1.0


def _parse(variant: str) -> tuple[str, int]:
    mode, _, b = variant.partition(" B=")
    return mode, int(b)


def _publish_only(env, count: int, batch: int):
    import time

    from dispatch_app.config.settings import dispatch_settings
    from dispatch_app.dispatch.sender import BoundedSender
    from dispatch_app.rq.publish import Publisher
    from dispatch_app.store.claim import Claimed

    conf = dispatch_settings(BATCH_SIZE=batch)
    publisher = Publisher(conf, connection=env.redis())
    sender = BoundedSender(conf.SEND_CONCURRENCY)
    envelopes = [Claimed(i, i, 1, "workflow", "workflow", 1, True) for i in range(1, count + 1)]
    size = conf.SEND_CHUNK_SIZE
    done = 0
    points = []
    started = time.monotonic()
    try:
        for first in range(0, count, batch):
            claimed = envelopes[first : first + batch]
            chunks = [claimed[i : i + size] for i in range(0, len(claimed), size)]
            done += sum(o.value.sent for o in sender.map(publisher.send, chunks) if o.ok)
            points.append((round(time.monotonic() - started, 3), done))
    finally:
        sender.close()
    elapsed = time.monotonic() - started
    env.redis().flushdb()
    metrics = {"envelopes": done, "drain_s": elapsed, "rate_per_s": rate(done, elapsed), "processes": 1}
    return metrics, {"progress": points}


def run(ctx: Context) -> list[dict]:
    env = ctx.env
    backlog = int(ctx.size("drain_envelopes", 100_000, 2_000))
    k_small = int(ctx.size("drain_tick_batches", 5, 2))

    def run_one(variant: str, index: int):
        mode, batch = _parse(variant)
        env.reset()
        if mode == "publish-only":
            return _publish_only(env, backlog, batch)
        count = backlog if mode in ("continue", "two-procs") else k_small * batch
        seed_pending(count)
        procs = 2 if mode == "two-procs" else 1
        spec = {
            "kind": "tick" if mode == "tick" else "dispatch",
            "listen": False,
            "poll": TICK,
            "batch": batch,
            "wait_go": True,
        }
        children = [Child(env, spec) for _ in range(procs)]
        try:
            t0 = db_now()
            for child in children:
                child.go()
            timeout = 60 + count / 2000 + (k_small * TICK * 2 if mode == "tick" else 0)
            done = wait_until(lambda: pending_count() == 0, timeout=timeout, interval=0.05)
        finally:
            for child in children:
                child.stop()
        offsets = dispatch_offsets(t0)
        drain_s = max(offsets) if offsets else None
        metrics = {
            "envelopes": len(offsets),
            "drain_s": drain_s,
            "rate_per_s": rate(len(offsets), drain_s),
            "complete": done,
            "batches_k": batches_for(count, batch),
            "processes": procs,
        }
        bucket = 0.05 if (drain_s or 0) < 5 else 0.1
        return metrics, {"progress": cumulative_progress(offsets, bucket)}

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    records = []
    for variant in VARIANTS:
        mode, batch = _parse(variant)
        count = backlog if mode in ("continue", "two-procs", "publish-only") else k_small * batch
        params = {
            "backlog": count,
            "batch_size": batch,
            "tick_s": TICK,
            "send_concurrency": 4,
            "chunk": 50,
            "processes": 2 if mode == "two-procs" else 1,
            "loop": {"tick": "one batch per tick", "publish-only": "no database: Redis only"}.get(
                mode, "continue while full"
            ),
        }
        records.append(
            record(
                NAME, variant, params, out["runs"][variant], out["series"][variant], error=out["errors"].get(variant)
            )
        )
    by = {r["variant"]: r["metrics"] for r in records}
    for batch in (100, 500):
        tick, cont = by[f"tick B={batch}"], by[f"continue-small B={batch}"]
        if tick.get("drain_s") is not None and cont.get("drain_s") is not None:
            tick["extra_wait_s"] = tick["drain_s"] - cont["drain_s"]
            tick["predicted_extra_wait_s"] = predicted_tick_wait(k_small, TICK)
    return records
