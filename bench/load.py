"""Load and observation shared by the scenarios.

- ``Child``: one dispatcher process (``bench.child``) with the ready/go/stop protocol.
- ``submit_paced``: the outbox write at a fixed rate; records the client-side commit time.
- ``RQObserver``: pops our Redis db's RQ queue lists (BLPOP), recording when each
  job id arrived: the client-side "commit -> in RQ" with one monotonic clock.
- Backlogs written in bulk SQL: ``bench.seed``.
- ``db_latencies``: ``dispatched_at - submitted_at`` (and ``started_at``) from the DB clock.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable

from bench.env import PYTHON, ROOT, BenchEnv
from bench.logs import drain, open_log
from dispatch_app.rq.ids import parse as parse_rq_id


class Child:
    def __init__(self, env: BenchEnv, spec: dict, *, ready_timeout: float = 60.0):
        self.spec = spec
        child_env = env.child_env()
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "bench.child", json.dumps(spec)],
            cwd=str(ROOT),
            env=child_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stats: dict = {}
        self._log = open_log(child_env, f"dispatcher-{spec.get('kind', 'child')}", self.proc.pid)
        self._stderr: list[str] = []
        self._stdout: list[str] = []
        self._ready = threading.Event()
        self._saw_ready = False
        threading.Thread(target=drain, args=(self.proc.stderr, self._stderr, self._log), daemon=True).start()
        # Its own reader, so the deadline holds even when the child never writes a line (a blocking
        # readline here once waited forever: the recovery child, which shares the pipe, had written its
        # start-up line between "ready" and its newline); "ready" is found at the end of a line.
        self._reader = threading.Thread(target=self._drain_stdout, daemon=True)
        self._reader.start()
        if not self._ready.wait(ready_timeout) or not self._saw_ready:
            self.kill()
            raise RuntimeError(
                f"dispatcher child did not start (exit {self.proc.poll()}) within {ready_timeout:g}s: "
                f"stdout {''.join(self._stdout)[-500:]!r}; stderr {''.join(self._stderr)[-2000:]}"
            )

    def _drain_stdout(self) -> None:
        for line in self.proc.stdout:
            self._stdout.append(line)
            if line.rstrip().endswith("ready"):
                self._saw_ready = True
                self._ready.set()
        self._ready.set()  # EOF: the wait ends; a child that died is reported by the caller's next step

    def send(self, word: str) -> None:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def go(self) -> None:
        self.send("go")

    def counts(self, timeout: float = 10.0) -> dict:
        """The dispatcher's drain counters so far (sends, dispatched, ...), asked for while it runs."""
        seen = len(self._stdout)
        self.send("report")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self._stdout[seen:]:
                if line.startswith("counts "):
                    return json.loads(line[7:])
            time.sleep(0.01)
        return {}

    def stop(self, timeout: float = 30.0) -> dict:
        try:
            self.send("stop")
        except (BrokenPipeError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reader.join(5)
        for line in list(self._stdout):
            if line.startswith("stats "):
                self.stats = json.loads(line[6:])
        return self.stats

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)


class RQObserver:
    """Pops RQ queue lists and records the arrival time of each job id (monotonic)."""

    def __init__(self, redis_url: str, queues: list[str]):
        import redis

        self.redis = redis.Redis.from_url(redis_url)
        self.keys = [f"rq:queue:{q}" for q in queues]
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-rq-observer", daemon=True)

    def start(self) -> RQObserver:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self.redis.blpop(self.keys, timeout=0.2)
            if item is None:
                continue
            now = time.monotonic()
            rq_id = item[1].decode()
            parsed = parse_rq_id(rq_id)
            if parsed is None:
                continue
            self.seen.setdefault(parsed.job_id, now)

    def wait_for(self, ids, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        wanted = set(ids)
        while time.monotonic() < deadline:
            if wanted.issubset(self.seen.keys()):
                return True
            time.sleep(0.02)
        return wanted.issubset(self.seen.keys())

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


def domain_keys(domains: list[str] | None) -> list[str]:
    from dispatch_app.domains.demo_payloads import demo_domain_keys

    return list(domains or demo_domain_keys())


def submit_paced(
    rate: float,
    count: int,
    *,
    domains: list[str] | None = None,
    group_interval: float = 0.005,
    on_commit: Callable[[list[int], float], None] | None = None,
    stop: threading.Event | None = None,
) -> dict:
    """Submit `count` jobs at `rate`/s, ``rate*group_interval`` jobs per transaction (at least 1).

    Returns job id -> monotonic time right after the commit, and the achieved rate.
    """

    from dispatch_app.domains.demo_payloads import demo_payload
    from dispatch_app.outbox.submit import JobSpec, submit_many

    keys = domain_keys(domains)
    group = max(1, round(rate * group_interval))
    interval = group / rate
    committed: dict[int, float] = {}
    start = time.monotonic()
    sent = 0
    index = 0
    try:
        while sent < count and not (stop is not None and stop.is_set()):
            target = start + index * interval
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            n = min(group, count - sent)
            specs = [
                JobSpec(keys[(sent + i) % len(keys)], demo_payload(keys[(sent + i) % len(keys)], sent + i))
                for i in range(n)
            ]
            jobs = submit_many(specs)
            now = time.monotonic()
            ids = [job.pk for job in jobs]
            for job_id in ids:
                committed[job_id] = now
            if on_commit is not None:
                on_commit(ids, now)
            sent += n
            index += 1
    finally:
        elapsed = time.monotonic() - start
    return {"committed": committed, "elapsed": elapsed, "achieved_rate": sent / elapsed if elapsed > 0 else None}


def db_latencies(ids, column: str = "dispatched_at") -> dict[int, float]:
    """ms from submitted_at to `column` per job, from the database clock."""
    from django.db import connection

    if column not in {"dispatched_at", "started_at", "finished_at"}:
        raise ValueError(column)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, extract(epoch FROM {column} - submitted_at) * 1000 FROM dispatch_app_job "
            f"WHERE id = ANY(%s) AND {column} IS NOT NULL",
            [list(ids)],
        )
        return {row[0]: float(row[1]) for row in cursor.fetchall()}


def queue_names() -> list[str]:
    """Every lane of every domain queue: what reaches RQ, whichever lane it lands in."""
    from dispatch_app.domains import lane_queue_names

    return list(lane_queue_names())


def db_now() -> float:
    """The database clock as epoch seconds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
        return float(cursor.fetchone()[0])


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def pending_count() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE status = 'pending'")
        return cursor.fetchone()[0]


def dispatch_offsets(t0_epoch: float, where: str = "TRUE", params=None) -> list[float]:
    """Seconds from t0 (DB epoch) to each envelope's dispatched_at."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM dispatched_at) - %s FROM dispatch_app_dispatchenvelope "
            f"WHERE status = 'dispatched' AND {where}",
            [t0_epoch, *(params or [])],
        )
        return [float(r[0]) for r in cursor.fetchall()]


def latency_run(
    env: BenchEnv,
    spec: dict,
    *,
    rate: float,
    count: int,
    warmup: int = 10,
    settle: float = 5.0,
    domains: list[str] | None = None,
    before: Callable[[], None] | None = None,
    during: Callable[[], None] | None = None,
    extra_specs: list[dict] | None = None,
) -> tuple[dict, dict, Child]:
    """Start a dispatcher child, submit `count` jobs at `rate`, and measure commit -> in RQ.

    Returns (metrics, series, child). `before` runs after the child is ready
    (e.g. start a sampler), `during` right before the paced submission.
    Latencies are in ms: ``db_*`` from dispatched_at - submitted_at (DB clock),
    ``client_*`` from the commit's return to the job id popping out of RQ.
    """
    from bench.stats import cdf_points, summarize

    observer = RQObserver(env.redis_url, queue_names()).start()
    extras: list[Child] = []
    try:
        # Other processes of the same deployment first (e.g. one that runs recovery).
        for extra in extra_specs or []:
            extras.append(Child(env, extra))
        child = Child(env, spec)
    except BaseException:
        for extra in extras:
            extra.stop()
        observer.stop()
        raise
    try:
        if before is not None:
            before()
        if warmup:
            warm = submit_paced(min(rate, 100), warmup, domains=domains)
            observer.wait_for(warm["committed"], timeout=settle)
        if during is not None:
            during()
        result = submit_paced(rate, count, domains=domains)
        committed = result["committed"]
        observer.wait_for(committed, timeout=settle)
    finally:
        stats = child.stop()
        extra_stats = [extra.stop() for extra in extras]
        observer.stop()
    client = [(observer.seen[i] - t) * 1000 for i, t in committed.items() if i in observer.seen]
    db = list(db_latencies(committed).values())
    metrics = {"jobs": len(committed), "achieved_rate": result["achieved_rate"], "missing": len(committed) - len(db)}
    for prefix, values in (("db", db), ("client", client)):
        summary = summarize(values)
        for key in ("p50", "p95", "p99", "max"):
            metrics[f"{prefix}_{key}_ms"] = summary[key]
    series = {"db_cdf": cdf_points(db), "client_cdf": cdf_points(client)}
    child.stats = dict(stats, extra=extra_stats)
    return metrics, series, child
