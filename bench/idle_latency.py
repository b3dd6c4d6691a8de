"""idle-latency: commit -> in RQ on an idle dispatcher, NOTIFY wake vs polling only (1 s tick).

The shipped dispatcher (LISTEN + fallback tick) against the same process with
``--no-listen``: a new envelope then waits for the next scan, ~I/2 on average.
"""

from __future__ import annotations

from bench import Context, record, side_by_side
from bench.load import latency_run
from bench.stats import ratio

NAME = "idle-latency"
RATES = (200, 1000)
VARIANTS = [f"{mode}@{rate}/s" for rate in RATES for mode in ("notify", "poll-1s")]


def run(ctx: Context) -> list[dict]:
    seconds = ctx.size("idle_seconds", 4.0, 0.25)
    env = ctx.env

    def run_one(variant: str, index: int):
        mode, rate_text = variant.split("@")
        rate = int(rate_text.removesuffix("/s"))
        env.reset()
        spec = {"kind": "dispatch", "listen": mode == "notify", "poll": 1.0}
        metrics, series, _ = latency_run(env, spec, rate=rate, count=max(20, int(rate * seconds)))
        return metrics, series

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    records = []
    for variant in VARIANTS:
        mode, rate_text = variant.split("@")
        params = {
            "rate_per_s": int(rate_text.removesuffix("/s")),
            "seconds": seconds,
            "poll_interval_s": 1.0,
            "wake": "LISTEN/NOTIFY + 1 s tick" if mode == "notify" else "1 s tick only",
        }
        records.append(
            record(
                NAME, variant, params, out["runs"][variant], out["series"][variant], error=out["errors"].get(variant)
            )
        )
    by_variant = {r["variant"]: r for r in records}
    for rate in RATES:
        notify = by_variant[f"notify@{rate}/s"]["metrics"]
        poll = by_variant[f"poll-1s@{rate}/s"]["metrics"]
        for key in ("db_p50_ms", "db_p99_ms", "client_p50_ms"):
            poll[f"{key.removesuffix('_ms')}_x_notify"] = ratio(poll.get(key), notify.get(key))
    return records
