"""recovery-dispatcher: 5 domains x 10k stale candidates while new jobs arrive at a fixed rate, measured up to
the RQ door (commit -> in RQ): the dispatcher side of a recovery storm. (Named ``recovery-storm`` before that
name went to the scenario measured at the job's first line, bench/recovery_storm.py.)

``on``: the default deployment of ``rundispatcher``: the real
``dispatch_app.recovery`` loops, one per domain (own thread and connection,
period 1 s, no jitter, B = 25), in the dispatcher's recovery child process at
nice +10, its sessions committing asynchronously and its rounds yielding to an
outbox backlog, re-dispatch or finish stale jobs through the outbox while the
dispatch loop serves new jobs.
``on, no yield`` (not in the default list): the same without the yield (``--recovery-no-yield``).
``on, backends niced``: an experiment, not the product: the same, and the bench
(root on PostgreSQL's host) renices the child's PostgreSQL backends (found by
their application_name) to nice 10 as they appear.
``on, as before``: the child as it was before both (``--recovery-sync-commit
--recovery-no-yield``).
``on, in process``: the same loops as threads of the dispatcher process
(``--recovery-in-process``; the shape measured before the child process).
``off``: the same process and backlog, no recovery loops.

Measured: new-job latency, each domain's oldest-candidate age over time,
effective recoveries per domain (actions / candidates scanned, from the
recorded rounds), time sessions spent waiting for locks (pg_stat_activity
sampled every 100 ms), and the dispatcher's connect and claim wait times.
"""

from __future__ import annotations

import threading
import time

from bench import Context, record, side_by_side
from bench.load import latency_run
from bench.seed import seed_stale
from bench.stats import ratio

NAME = "recovery-dispatcher"
VARIANTS = ["off", "on", "on, backends niced", "on, as before", "on, in process"]
STALE_SECONDS = 600.0

AGE_SQL = """
SELECT domain, extract(epoch FROM clock_timestamp() - min(updated_at))
FROM dispatch_app_job
WHERE status IN ('submitted', 'queued', 'running')
  AND updated_at < clock_timestamp() - make_interval(secs => %s)
GROUP BY domain
"""

WAIT_SQL = """
SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*),
       string_agg(wait_event, ',') FILTER (WHERE wait_event_type = 'Lock')
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


# The bench database's client backends, split into the recovery child's (named by
# runtime.recovery_child.recovery_sessions) and every other one (dispatcher, submitter, samplers).
BACKENDS_SQL = """
SELECT pid, application_name = %s FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
"""


class CpuSplit:
    """Where the machine's CPU went while the storm ran: PostgreSQL backends by role, and the whole machine.

    Read every 0.5 s from the kernel's counters (psutil); a process keeps the last
    value read before it ended (a backend whose session closes loses < 0.5 s).
    """

    def __init__(self):
        import psutil

        self.psutil = psutil
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.role: dict[int, str] = {}
        self.machine_first = self.machine_last = self._busy()

    def _busy(self) -> tuple[float, float]:
        t = self.psutil.cpu_times()
        return time.monotonic(), t.user + t.nice + t.system + t.irq + t.softirq + t.steal

    def read(self, conn) -> None:
        from bench.cpu import process_cpu
        from dispatch_app.runtime.recovery_child import APPLICATION_NAME

        ours = {}
        for pid, recovery in conn.execute(BACKENDS_SQL, [APPLICATION_NAME]).fetchall():
            ours[pid] = "pg_recovery" if recovery else "pg_bench_other"
        first_read = not self.last
        for proc in self.psutil.process_iter(["name"]):
            if proc.info["name"] != "postgres":
                continue
            pid = proc.pid
            if pid in ours:
                self.role[pid] = ours[pid]  # a backend seen before its session showed up is named now
            else:
                self.role.setdefault(pid, "pg_other_databases")
            cpu = process_cpu(pid, children=False)
            if cpu:
                # A process first seen after the start began inside the window: all of its CPU counts.
                self.first.setdefault(pid, cpu if first_read else 0.0)
                self.last[pid] = cpu
        self.machine_last = self._busy()

    def seconds(self) -> dict[str, float]:
        out = {"pg_recovery": 0.0, "pg_bench_other": 0.0, "pg_other_databases": 0.0}
        for pid, cpu in self.last.items():
            out[self.role[pid]] += cpu - self.first[pid]
        (t0, busy0), (t1, busy1) = self.machine_first, self.machine_last
        out["machine_busy"] = busy1 - busy0
        out["machine_capacity"] = (t1 - t0) * (self.psutil.cpu_count() or 1)
        return out


RECOVERY_BACKENDS_SQL = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s"


class Sampler:
    def __init__(self, env, domains, *, nice_recovery_backends: int = 0):
        self.env = env
        self.domains = domains
        # An experiment, not the product: with root on PostgreSQL's own host, renice the recovery child's backends.
        self.nice_recovery_backends = nice_recovery_backends
        self.reniced: set[int] = set()
        self.renice_error = ""
        self.ages: dict[str, list] = {d: [] for d in domains}
        self.lock_wait_s = 0.0
        self.lock_events: dict[str, float] = {}
        self.max_backends = 0
        self.cpu: CpuSplit | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="bench-storm-sampler")

    def start(self):
        self.t0 = time.monotonic()
        self.thread.start()

    def _run(self):
        with self.env.raw() as conn:
            last_age = last_cpu = 0.0
            self.cpu = CpuSplit()
            self.cpu.read(conn)
            while not self._stop.wait(0.1):
                now = time.monotonic() - self.t0
                if now - last_cpu >= 0.5:
                    last_cpu = now
                    self.cpu.read(conn)
                if self.nice_recovery_backends:
                    self._renice(conn)
                waiting, backends, events = conn.execute(WAIT_SQL).fetchone()
                self.lock_wait_s += waiting * 0.1
                for event in (events or "").split(","):
                    if event:
                        # e.g. "object": the commit of a NOTIFYing transaction; "transactionid": a row lock.
                        self.lock_events[event] = self.lock_events.get(event, 0.0) + 0.1
                self.max_backends = max(self.max_backends, backends)
                if now - last_age >= 0.25:
                    last_age = now
                    seen = dict(conn.execute(AGE_SQL, [STALE_SECONDS]).fetchall())
                    for domain in self.domains:
                        age = seen.get(domain)
                        self.ages[domain].append((round(now, 3), float(age) if age is not None else 0.0))

    def _renice(self, conn) -> None:
        import os

        from dispatch_app.runtime.recovery_child import APPLICATION_NAME

        for (pid,) in conn.execute(RECOVERY_BACKENDS_SQL, [APPLICATION_NAME]).fetchall():
            if pid in self.reniced:
                continue
            try:
                os.setpriority(os.PRIO_PROCESS, pid, self.nice_recovery_backends)
                self.reniced.add(pid)
            except OSError as exc:  # not root, or PostgreSQL on another host
                self.renice_error = self.renice_error or f"{type(exc).__name__}: {exc}"

    def stop(self):
        self._stop.set()
        if self.thread.ident is not None:
            self.thread.join(5)


def _rounds() -> dict[str, dict]:
    """Per-domain totals of the recovery rounds the loops recorded (dispatch_app_recoveryround)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT domain, count(*), sum(scanned), sum(redispatched), sum(unknown), sum(failed), "
            "sum(left_alone), sum(errors) FROM dispatch_app_recoveryround GROUP BY domain"
        )
        keys = ("rounds", "scanned", "redispatched", "unknown", "failed", "left_alone", "errors")
        return {row[0]: dict(zip(keys, (int(v or 0) for v in row[1:]), strict=True)) for row in cursor.fetchall()}


def run(ctx: Context) -> list[dict]:
    from dispatch_app.domains.demo_payloads import (
        demo_domain_keys as domain_keys,  # the shipped five (a demo payload each)
    )

    env = ctx.env
    domains = list(domain_keys())
    per_domain = int(ctx.size("storm_stale_per_domain", 10_000, 200))
    rate = ctx.size("storm_rate", 200.0, 200.0)
    seconds = ctx.size("storm_seconds", 8.0, 0.6)
    period = ctx.size("storm_period_s", 1.0, 0.2)

    def run_one(variant: str, index: int):
        env.reset()
        seed_stale(per_domain, domains)
        sampler = Sampler(env, domains, nice_recovery_backends=10 if "backends niced" in variant else 0)
        spec = {"kind": "dispatch", "listen": True, "poll": 1.0}
        extra_specs = []
        if variant.startswith("on"):
            overrides = {
                "PERIOD_SECONDS": period,
                "JITTER_SECONDS": 0.0,
                "BATCH_SIZE": 25,
                "QUEUED_STALE_SECONDS": STALE_SECONDS,
            }
            recovery = {"domains": domains, "overrides": {d: dict(overrides) for d in domains}}
            # Only "on, in process" keeps the loops as threads of the dispatcher (as measured before the child).
            in_process = variant == "on, in process"
            spec["real_recovery"] = recovery
            spec["recovery_in_process"] = in_process
            spec["recovery_sync_commit"] = "as before" in variant
            spec["recovery_no_yield"] = "as before" in variant or "no yield" in variant
        try:
            metrics, series, child = latency_run(
                env, spec, rate=rate, count=int(rate * seconds), before=sampler.start, extra_specs=extra_specs
            )
        finally:
            sampler.stop()
        rec = _rounds()
        scanned = sum(d["scanned"] for d in rec.values())
        actions = sum(d["redispatched"] + d["unknown"] + d["failed"] for d in rec.values())
        metrics.update(
            {
                "recovered": actions,
                "scanned": scanned,
                "effective_pct": 100.0 * actions / scanned if scanned else None,
                "lock_wait_s": sampler.lock_wait_s,
                **{f"lock_wait_s.{event}": seconds for event, seconds in sampler.lock_events.items()},
                "connect_s": child.stats.get("connect_wait_s"),
                "claim_lock_wait_s": child.stats.get("claim_wait_s"),
                # The dispatcher's drains by what woke them, what they claimed, and its NOTIFY arm changes.
                **{k: v for k, v in child.stats.items() if k.startswith(("drains", "notify_")) or k == "claimed"},
                "max_backends": sampler.max_backends,
                "reniced_backends": len(sampler.reniced),
                # Where the dispatcher side's CPU went: the dispatcher process, its recovery child, another process.
                "cpu_dispatcher_s": child.stats.get("cpu_self_s"),
                "cpu_recovery_child_s": child.stats.get("cpu_children_s"),
                "cpu_other_process_s": sum(
                    e.get("cpu_self_s", 0) + e.get("cpu_children_s", 0) for e in child.stats.get("extra", [])
                ),
                # PostgreSQL's side, over the sampled window: the recovery child's backends (0 where recovery
                # runs as threads: their sessions are not named apart), the bench database's other backends,
                # every other PostgreSQL process, and the machine's busy core-seconds against its capacity.
                **{f"cpu_{k}_s": v for k, v in (sampler.cpu.seconds() if sampler.cpu else {}).items()},
            }
        )
        for domain, d in rec.items():
            acted = d["redispatched"] + d["unknown"] + d["failed"]
            metrics[f"{domain}.recovered"] = acted
            metrics[f"{domain}.effective_pct"] = 100.0 * acted / d["scanned"] if d["scanned"] else None
            metrics[f"{domain}.rounds"] = d["rounds"]
        for domain, points in sampler.ages.items():
            if points:
                metrics[f"{domain}.oldest_age_drop_s"] = points[0][1] - points[-1][1]
        series["oldest_age"] = sampler.ages
        return metrics, series

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    params = {
        "stale_per_domain": per_domain,
        "domains": len(domains),
        "rate_per_s": rate,
        "seconds": seconds,
        "recovery_period_s": period,
        "recovery_batch": 25,
    }
    records = [
        record(NAME, v, dict(params, recovery=v), out["runs"][v], out["series"][v], error=out["errors"].get(v))
        for v in VARIANTS
    ]
    base = records[0]["metrics"].get("db_p99_ms")
    for rec in records:
        if rec["metrics"]:
            rec["metrics"]["p99_x_off"] = ratio(rec["metrics"].get("db_p99_ms"), base)
    return records
