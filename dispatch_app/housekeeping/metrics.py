"""Prometheus metrics for ``rundispatcher``.

Two sources: ``DispatchMetrics`` is the supervisor's observer (the dispatch
loop, the listener and the loop runners call it), and ``DatabaseCollector``
computes gauges from the database on each scrape, through ``views.stats`` (the
same SQL as the dashboard). Every metric is documented in docs/operations.md.
"""

from __future__ import annotations

import logging
import threading

from django.db import connection
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

import dispatch_app.rq.state.refusals as refusals
import dispatch_app.views.stats as stats
from dispatch_app.domains import domain_keys
from dispatch_app.housekeeping.operator_metrics import OperatorCollector
from dispatch_app.models import ACTIVE_STATUSES

log = logging.getLogger("dispatch_app.housekeeping.metrics")

TRIGGERS = ("notify", "tick", "catch_up", "due")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


class DispatchMetrics:
    """The observer: ``drained``, ``listener_reconnect``, ``loop_tick``, ``loop_error``."""

    def __init__(self, registry: CollectorRegistry | None = None, *, database: bool = True):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._declare_drains(r)
        self._declare_sends(r)
        self._declare_waits(r)
        self._pauses = 0
        for trigger in TRIGGERS:
            self.scans.labels(trigger)
        self.collector = DatabaseCollector() if database else None
        if self.collector is not None:
            r.register(self.collector)
            self.operator_collector = OperatorCollector()
            r.register(self.operator_collector)
            r.register(RefusedJobsCollector())

    def _declare_drains(self, r: CollectorRegistry) -> None:
        """What the drains moved and what woke them."""
        self.latency = Histogram(
            "productflow_dispatch_latency_seconds",
            "Outbox wait of each dispatched envelope: created (submitted) -> marked dispatched, database clock.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.dispatched = Counter("productflow_envelopes_dispatched", "Envelopes sent to RQ and marked.", registry=r)
        self.send_failures = Counter(
            "productflow_envelope_send_failures", "Failed sends (backed off or dead).", registry=r
        )
        self.dead = Counter("productflow_envelopes_dead", "Envelopes that became dead (dead-lettered).", registry=r)
        self.scans = Counter(
            "productflow_dispatch_scans", "Drains of the outbox, by what woke them.", ["trigger"], registry=r
        )
        self.missed_wakeups = Counter(
            "productflow_missed_wakeups",
            "Never-sent envelopes found by a tick-triggered scan: work no NOTIFY announced.",
            registry=r,
        )
        self.claims_skipped = Counter(
            "productflow_dispatch_claims_skipped",
            "Drains woken only by NOTIFYs that named their envelopes, all sent ahead: no claim was made.",
            registry=r,
        )

    def _declare_sends(self, r: CollectorRegistry) -> None:
        """Sends to RQ (ahead of the claim or after it), the listener, the loops."""
        self.sent_ahead = Counter(
            "productflow_envelopes_sent_ahead",
            "Envelopes sent to RQ before their claim: a NOTIFY named them (dispatch.announced).",
            registry=r,
        )
        self.sends = Counter(
            "productflow_envelope_sends",
            "Envelopes Redis answered a send for, ahead of their claim or after it (more than dispatched: waste).",
            registry=r,
        )
        self.send_duplicates = Counter(
            "productflow_envelope_send_duplicates",
            "Sends that found the RQ job there already (create-if-absent left it alone).",
            registry=r,
        )
        self.foreign_hashes = Counter(
            "productflow_rq_foreign_hashes_replaced",
            "Sends that found a job hash at their RQ id this deployment's dispatcher did not write, and replaced it.",
            registry=r,
        )
        self.listener_reconnects = Counter(
            "productflow_listener_reconnects", "LISTEN connection losses (each followed by a reconnect).", registry=r
        )
        self.loop_errors = Counter("productflow_loop_errors", "Failed rounds per loop.", ["loop"], registry=r)
        self.loop_ticks = Counter("productflow_loop_ticks", "Successful rounds per loop.", ["loop"], registry=r)

    def _declare_waits(self, r: CollectorRegistry) -> None:
        """Waits for a connection and in the claim; the Redis breaker."""
        self.connection_wait = Histogram(
            "productflow_db_connection_wait_seconds",
            "Time the dispatch loop waited for a database connection, per drain.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.claim_wait = Histogram(
            "productflow_claim_lock_wait_seconds",
            "Time in the claim transaction (row locks are SKIP LOCKED, so this bounds the lock wait), per drain.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.redis_circuit_open = Gauge(
            "productflow_redis_circuit_open",
            "1 while dispatch is paused because Redis as a whole refuses sends (OOM, READONLY, unreachable, ...).",
            registry=r,
        )
        self.outage_pauses = Counter(
            "productflow_dispatch_outage_pauses",
            "Dispatch pauses started by a server-wide Redis refusal (the breaker opening).",
            registry=r,
        )
        self.outage_released = Counter(
            "productflow_envelopes_outage_released",
            "Envelopes given back uncounted because Redis as a whole refused their send.",
            registry=r,
        )

    def declare_loops(self, names) -> None:
        """Exported at 0 from the start, so a rate() over the first error is not lost."""
        for name in names:
            self.loop_errors.labels(name)
            self.loop_ticks.labels(name)

    def drained(self, result) -> None:
        breaker = getattr(result, "breaker", None)
        if breaker is not None:
            self.redis_circuit_open.set(0 if breaker.state == "closed" else 1)
            self.outage_pauses.inc(max(0, breaker.pauses - self._pauses))
            self._pauses = max(self._pauses, breaker.pauses)
        self.outage_released.inc(getattr(result, "outage_released", 0))
        if getattr(result, "paused", False):
            return  # not a scan: nothing was claimed
        self.scans.labels(result.trigger).inc()
        self.dispatched.inc(result.dispatched)
        self.send_failures.inc(result.failed + result.dead)
        self.dead.inc(result.dead)
        self.missed_wakeups.inc(result.unannounced)
        self.sent_ahead.inc(getattr(result, "sent_ahead", 0))
        self.sends.inc(getattr(result, "sends", 0))
        self.claims_skipped.inc(1 if getattr(result, "claim_skipped", False) else 0)
        self.send_duplicates.inc(getattr(result, "duplicates", 0))
        self.foreign_hashes.inc(getattr(result, "foreign", 0))
        for latency in getattr(result, "latencies", ()):
            self.latency.observe(max(0.0, latency))
        self.connection_wait.observe(getattr(result, "connect_seconds", 0.0))
        self.claim_wait.observe(getattr(result, "claim_seconds", 0.0))

    def listener_reconnect(self) -> None:
        self.listener_reconnects.inc()

    def loop_tick(self, name: str) -> None:
        self.loop_ticks.labels(name).inc()

    def loop_error(self, name: str, exc: BaseException) -> None:
        self.loop_errors.labels(name).inc()


class DatabaseCollector:
    """Gauges read from the database on each scrape (one connection per scrape thread, closed after)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._round_watermark = self._max_round_id()
        self._decisions = {(d, k): 0 for d in domain_keys() for k in stats.DECISION_KINDS}

    @staticmethod
    def _max_round_id() -> int:
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT COALESCE(max(id), 0) FROM {stats.ROUND}")
                return cursor.fetchone()[0]
        finally:
            if not connection.in_atomic_block:
                connection.close()

    def collect(self):
        up = GaugeMetricFamily("productflow_stats_up", "1 if the last scrape could read the database.")
        try:
            with self._lock:
                families = self._collect_db()
            up.add_metric([], 1)
        except Exception:
            log.exception("metrics scrape could not read the database", extra={"action": "metrics_db_error"})
            families = []
            up.add_metric([], 0)
        finally:
            # The scrape runs on the HTTP server's thread: do not leave its connection behind.
            if not connection.in_atomic_block:
                connection.close()
        yield up
        yield from families

    def _collect_db(self):
        with connection.cursor() as cursor:
            jobs = stats.job_summary(cursor)
            envelopes = stats.envelope_summary(cursor)
            rounds = stats.recovery_rounds_after(cursor, self._round_watermark)
            queue_usage = stats.notification_queue_usage(cursor)
        for round_id, domain, *counts in rounds:
            for kind, count in zip(stats.DECISION_KINDS, counts, strict=True):
                self._decisions[(domain, kind)] = self._decisions.get((domain, kind), 0) + count
            self._round_watermark = max(self._round_watermark, round_id)

        pending_age = GaugeMetricFamily(
            "productflow_oldest_pending_envelope_age_seconds",
            "Age of the oldest pending envelope (not counting never-tried ones scheduled for later); 0 if none.",
            labels=["domain"],
        )
        candidate_age = GaugeMetricFamily(
            "productflow_oldest_candidate_age_seconds",
            "now - updated_at of the domain's oldest unfinished job (recovery's first candidate); 0 if none.",
            labels=["domain"],
        )
        backlog = GaugeMetricFamily(
            "productflow_jobs", "Unfinished jobs by domain and status.", labels=["domain", "status"]
        )
        outbox = GaugeMetricFamily(
            "productflow_envelopes", "Envelopes now pending or dead, by domain.", labels=["domain", "status"]
        )
        # A domain no longer registered still shows while it has rows (its dead envelopes above all).
        for domain in [*domain_keys(), *sorted((set(envelopes) | set(jobs)) - set(domain_keys()))]:
            env = envelopes.get(domain, {})
            job = jobs.get(domain, {})
            pending_age.add_metric([domain], env.get("oldest_pending_age") or 0.0)
            candidate_age.add_metric([domain], job.get("oldest_candidate_age") or 0.0)
            for status in ACTIVE_STATUSES:
                backlog.add_metric([domain, status], job.get("backlog", {}).get(status, 0))
            for status in ("pending", "dead"):
                outbox.add_metric([domain, status], env.get(status, 0))
        decisions = CounterMetricFamily(
            "productflow_recovery_decisions",
            "Recovery decisions per domain and kind, from rounds finished since this process started "
            "(cluster-wide: with several dispatchers use max(), not sum()).",
            labels=["domain", "kind"],
        )
        for (domain, kind), count in sorted(self._decisions.items()):
            decisions.add_metric([domain, kind], count)
        usage = GaugeMetricFamily(
            "productflow_notification_queue_usage", "pg_notification_queue_usage(): 1.0 = NOTIFY queue full."
        )
        usage.add_metric([], queue_usage)
        return [pending_age, candidate_age, backlog, outbox, decisions, usage]


class RefusedJobsCollector:
    """Jobs the workers refused to run (rq.worker.admission), read from Redis on each scrape."""

    def collect(self):
        totals = refusals.totals()
        refused = CounterMetricFamily(
            "productflow_rq_jobs_refused",
            "Jobs taken from Redis that were not the project's work (forged or foreign), never run; by why. "
            "Counted per Redis server over the last 7 days (rq.state.refusals.REFUSED_TTL).",
            labels=["kind"],
        )
        for kind in refusals.KINDS:
            refused.add_metric([kind], totals["kinds"].get(kind, 0))
        yield refused


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1"):
    """Start the HTTP endpoint on its own thread; returns (server, close)."""
    server, thread = start_http_server(port, addr=host, registry=registry)

    def close() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    log.info("metrics on http://%s:%s/metrics", host, server.server_address[1], extra={"action": "metrics_started"})
    return server, close
