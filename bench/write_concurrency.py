"""write-concurrency: what NOTIFY on commit costs concurrent writers, and what conditional NOTIFY saves.

Every commit that called ``pg_notify`` takes PostgreSQL's cluster-wide notify
lock until it is done, so notifying writers commit one at a time (issue 10).
Three envelope-trigger modes, side by side in one run:

- ``today``: the trigger and the dispatcher as they were (every commit notifies; no arming);
- ``conditional``: the shipped trigger (notifies only while a dispatcher is
  armed; dispatch_app.dispatch.arming);
- ``disabled``: no trigger at all (the writers' ceiling); its dispatcher polls
  every POLL_LINGER (5 ms), as often as a busy disarmed one, so each mode
  moves the same work to RQ while the writers run (its "missed wake-ups" are
  those polls, by construction).

Writers are ``pgbench`` clients (1, 16, 64), each transaction one job + one
envelope, the rows ``submit`` writes, so the client's own CPU does not cap the
rate; a real dispatcher (listener, arming, dispatch loop on its own thread)
runs meanwhile and moves everything to RQ. Reported: submits/s, submit latency
(pgbench's per-transaction latency), the dispatcher's missed wake-ups
(first sends found by the fallback tick). Then, per mode, idle commit -> in
RQ latency: jobs submitted one at a time at a low rate with ``submit()``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench import Context, record, side_by_side
from bench.stats import ratio, summarize
from dispatch_app.dispatch.arming import POLL_LINGER

NAME = "write-concurrency"
MODES = ("today", "conditional", "disabled")
WRITERS = (1, 16, 64)
VARIANTS = [f"{mode}@{w}w" for w in WRITERS for mode in MODES] + [f"{mode}@idle" for mode in MODES]

_ENVELOPE = "dispatch_app_dispatchenvelope"
# The trigger bodies before conditional NOTIFY (migration 0003), for the "today" mode.
_TODAY_INSERT = (
    "PERFORM pg_notify('{channel}', d.domain) "
    "FROM (SELECT DISTINCT domain FROM new_rows WHERE status = 'pending') d; RETURN NULL;"
)


class Triggers:
    """Switches the envelope NOTIFY triggers of the bench database between the three modes."""

    def __init__(self, conn):
        self.conn = conn
        rows = conn.execute(
            "SELECT t.tgname, t.tgfoid::regproc::text, pg_get_functiondef(t.tgfoid) FROM pg_trigger t "
            f"WHERE t.tgrelid = '{_ENVELOPE}'::regclass AND t.tgname LIKE 'pgtrigger_envelope_notify_insert%%'"
        ).fetchall()
        if len(rows) != 1:
            raise RuntimeError(f"expected one envelope insert NOTIFY trigger, found {[r[0] for r in rows]}")
        self.name, self.function, self.shipped = rows[0]

    def set(self, mode: str) -> None:
        from dispatch_app.config.settings import NOTIFY_CHANNEL

        self.conn.execute(self.shipped)
        self.conn.execute(f"ALTER TABLE {_ENVELOPE} ENABLE TRIGGER {self.name}")
        if mode == "today":
            body = _TODAY_INSERT.format(channel=NOTIFY_CHANNEL)
            self.conn.execute(
                f"CREATE OR REPLACE FUNCTION {self.function}() RETURNS trigger LANGUAGE plpgsql "
                f"AS $body$ BEGIN {body} END; $body$"
            )
        elif mode == "disabled":
            self.conn.execute(f"ALTER TABLE {_ENVELOPE} DISABLE TRIGGER {self.name}")

    def restore(self) -> None:
        self.set("conditional")


class Dispatcher:
    """The shipped wake-up path in this process: Listener + arming + dispatch loop, counting missed wakes."""

    def __init__(self, env, poll_interval: float = 1.0, *, arming: bool = True):
        from dispatch_app.config.settings import dispatch_settings
        from dispatch_app.dispatch.listener import Listener
        from dispatch_app.dispatch.loop import DispatchLoop
        from dispatch_app.dispatch.wake import Wake
        from dispatch_app.rq.publish import Publisher
        from dispatch_app.runtime.runner import LoopRunner

        # replace(): the polling baseline ticks faster than the validated minimum allows.
        self.conf = dataclasses.replace(dispatch_settings(), POLL_INTERVAL=poll_interval)
        self.stop = threading.Event()
        self.wake = Wake()
        self.unannounced = 0
        self.scans: dict[str, int] = {}
        self.listener = Listener(self.conf, self.wake, self.stop)
        if not arming:
            # The dispatcher as it was before conditional NOTIFY: it never arms, the trigger decides alone.
            self.wake.arming = None
        self.loop = DispatchLoop(
            self.conf, wake=self.wake, stop=self.stop, publisher=Publisher(self.conf, env.redis()), observer=self
        )
        self.runner = LoopRunner(self.loop, self.stop)

    def drained(self, result) -> None:
        self.unannounced += result.unannounced
        self.scans[result.trigger] = self.scans.get(result.trigger, 0) + 1

    def start(self) -> Dispatcher:
        self.listener.start()
        self.runner.start()
        if not self.listener.connected.wait(10):
            raise RuntimeError("the listener did not connect")
        return self

    def close(self) -> dict:
        from dispatch_app.dispatch.wake import STOP

        self.stop.set()
        self.wake.set(STOP)
        self.runner.join(10)
        self.listener.join(10)
        self.loop.close()
        arming = self.wake.arming
        if arming is None:
            return {"scans": self.scans}
        return {"arms": arming.arms, "disarms": arming.disarms, "handovers": arming.handovers, "scans": self.scans}


def _pgbench_script(path: Path) -> None:
    from dispatch_app.domains import get_domain
    from dispatch_app.domains.demo_payloads import demo_payload

    payload = json.dumps(demo_payload("delivery", 0)).replace("'", "''")
    queue = get_domain("delivery").queue
    path.write_text(
        "BEGIN;\n"
        "INSERT INTO dispatch_app_job (domain, status, attempt, payload, error, vendor_request_id, submitted_at, "
        f"updated_at) VALUES ('delivery', 'submitted', 1, '{payload}'::jsonb, '', '', clock_timestamp(), "
        "clock_timestamp()) RETURNING id \\gset\n"
        f"INSERT INTO {_ENVELOPE} (job_id, attempt, domain, queue, status, available_at, send_attempts, last_error, "
        f"created_at) VALUES (:id, 1, 'delivery', '{queue}', 'pending', clock_timestamp(), 0, '', clock_timestamp());\n"
        "END;\n"
    )


def pgbench(env, writers: int, seconds: float, workdir: Path) -> dict:
    """pgbench clients committing job + envelope; submits/s and per-transaction latency (ms)."""
    info = env.conninfo()
    script = workdir / "submit.sql"
    _pgbench_script(script)
    for old in workdir.glob("wc.*"):
        old.unlink()
    cmd = [
        shutil.which("pgbench") or "pgbench",
        "-n",
        "-c",
        str(writers),
        "-j",
        str(min(writers, 4)),
        "-T",
        str(max(1, round(seconds))),
        "-f",
        str(script),
        "-l",
        f"--log-prefix={workdir / 'wc'}",
        "-d",
        info["dbname"],
    ]
    for flag, key in (("-h", "host"), ("-p", "port"), ("-U", "user")):
        if info.get(key):
            cmd += [flag, str(info[key])]
    extra_env = {"PGPASSWORD": str(info["password"])} if info.get("password") else {}
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds + 120, env={**os.environ, **extra_env}, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", done.stdout)
    latencies = []
    for log in workdir.glob("wc.*"):
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                latencies.append(int(parts[2]) / 1000.0)
    summary = summarize(latencies)
    return {
        "submits_per_s": float(tps.group(1)) if tps else None,
        "submits": len(latencies),
        "submit_p50_ms": summary["p50"],
        "submit_p99_ms": summary["p99"],
    }


def python_writers(env, writers: int, seconds: float) -> dict:
    """Without pgbench: the same transaction from psycopg threads (the client's GIL then caps the rate)."""
    import psycopg

    from dispatch_app.domains import get_domain
    from dispatch_app.domains.demo_payloads import demo_payload

    payload = json.dumps(demo_payload("delivery", 0))
    queue = get_domain("delivery").queue
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def write():
        try:
            with psycopg.connect(**env.conninfo()) as conn:
                start.wait(30)
                mine = []
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    began = time.perf_counter()
                    with conn.transaction():
                        job_id = conn.execute(_PY_JOB, ["delivery", payload]).fetchone()[0]
                        conn.execute(_PY_ENVELOPE, [job_id, "delivery", queue])
                    mine.append((time.perf_counter() - began) * 1000)
                with lock:
                    latencies.extend(mine)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=write, daemon=True) for _ in range(writers)]
    for t in threads:
        t.start()
    start.wait(30)
    for t in threads:
        t.join(seconds + 60)
    if errors:
        raise errors[0]
    summary = summarize(latencies)
    return {
        "submits_per_s": len(latencies) / seconds,
        "submits": len(latencies),
        "submit_p50_ms": summary["p50"],
        "submit_p99_ms": summary["p99"],
    }


_PY_JOB = (
    "INSERT INTO dispatch_app_job (domain, status, attempt, payload, error, vendor_request_id, submitted_at, "
    "updated_at) VALUES (%s, 'submitted', 1, %s::jsonb, '', '', clock_timestamp(), clock_timestamp()) RETURNING id"
)
_PY_ENVELOPE = (
    f"INSERT INTO {_ENVELOPE} (job_id, attempt, domain, queue, status, available_at, send_attempts, last_error, "
    "created_at) VALUES (%s, 1, %s, %s, 'pending', clock_timestamp(), 0, '', clock_timestamp())"
)


def _wait_drained(timeout: float) -> bool:
    from bench.load import pending_count, wait_until

    return wait_until(lambda: pending_count() == 0, timeout, interval=0.05)


def idle_latency(env, count: int, rate: float) -> dict:
    """Jobs committed one at a time at a low rate; commit -> in RQ (database clock and client side)."""
    from bench.load import RQObserver, db_latencies, queue_names, submit_paced

    observer = RQObserver(env.redis_url, queue_names()).start()
    try:
        result = submit_paced(rate, count, domains=["delivery"])
        observer.wait_for(result["committed"], timeout=10)
    finally:
        observer.stop()
    committed = result["committed"]
    client = [(observer.seen[i] - t) * 1000 for i, t in committed.items() if i in observer.seen]
    db = list(db_latencies(committed).values())
    metrics = {"jobs": len(committed), "missing": len(committed) - len(db)}
    for prefix, values in (("db", db), ("client", client)):
        summary = summarize(values)
        for key in ("p50", "p99"):
            metrics[f"{prefix}_{key}_ms"] = summary[key]
    return metrics


def run(ctx: Context) -> list[dict]:
    env = ctx.env
    seconds = ctx.size("write_seconds", 5.0, 1.0)
    idle_jobs = ctx.size("write_idle_jobs", 200, 20)
    idle_rate = ctx.size("write_idle_rate", 20.0, 40.0)
    workdir = Path(tempfile.mkdtemp(prefix="pf-write-concurrency-"))
    admin = env.raw(autocommit=True)
    conn = admin.__enter__()
    triggers = Triggers(conn)

    def run_one(variant: str, index: int):
        mode, what = variant.split("@")
        env.reset()
        triggers.set(mode)
        # Without a trigger the dispatcher can only poll; it polls as often as a busy armed one
        # does (POLL_LINGER), so every mode moves the same work to RQ during the run.
        dispatcher = Dispatcher(env, POLL_LINGER if mode == "disabled" else 1.0, arming=mode == "conditional").start()
        arming = {}
        try:
            if what == "idle":
                metrics = idle_latency(env, idle_jobs, idle_rate)
            else:
                writers = int(what.removesuffix("w"))
                if shutil.which("pgbench"):
                    metrics = pgbench(env, writers, seconds, workdir)
                else:
                    metrics = python_writers(env, writers, seconds)
                metrics["drained"] = _wait_drained(30.0)
        finally:
            arming = dispatcher.close()
        metrics["missed_wakeups"] = dispatcher.unannounced
        metrics.update({k: v for k, v in arming.items() if k != "scans"})
        return metrics, {}

    try:
        out = side_by_side(ctx, NAME, VARIANTS, run_one)
    finally:
        triggers.restore()
        admin.__exit__(None, None, None)
        shutil.rmtree(workdir, ignore_errors=True)
    records = []
    for variant in VARIANTS:
        mode, what = variant.split("@")
        params = {
            "trigger": mode,
            "writers": "1 (submit(), paced)" if what == "idle" else int(what.removesuffix("w")),
            "seconds": seconds if what != "idle" else None,
            "idle_rate_per_s": idle_rate if what == "idle" else None,
            "writer": "submit() at a low rate"
            if what == "idle"
            else f"{'pgbench' if shutil.which('pgbench') else 'psycopg threads'}: BEGIN; job; envelope; COMMIT",
        }
        records.append(record(NAME, variant, params, out["runs"][variant], error=out["errors"].get(variant)))
    by = {r["variant"]: r["metrics"] for r in records}
    for w in WRITERS:
        disabled = by[f"disabled@{w}w"].get("submits_per_s")
        for mode in ("today", "conditional"):
            m = by[f"{mode}@{w}w"]
            m["submits_x_disabled"] = ratio(m.get("submits_per_s"), disabled)
    today = by["today@idle"]
    for mode in ("conditional", "disabled"):
        m = by[f"{mode}@idle"]
        for key in ("db_p50_ms", "db_p99_ms", "client_p50_ms", "client_p99_ms"):
            m[f"{key.removesuffix('_ms')}_x_today"] = ratio(m.get(key), today.get(key))
    return records
