"""Prometheus metrics read on each scrape from PostgreSQL and Redis: job outcomes, RQ-queue waits, the RQ side.

Registered by ``housekeeping.metrics.DispatchMetrics``; every metric is documented in docs/operations.md.
"""

from __future__ import annotations

import logging
import threading

from django.db import connection
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

import dispatch_app.timeline.stage_sql as stage_sql
from dispatch_app.domains import domain_keys
from dispatch_app.store.tables import ATTEMPT

log = logging.getLogger("dispatch_app.housekeeping.metrics")


# RQ-queue wait of one attempt (dispatched -> started): from sub-millisecond to a backlog of hours.
RQ_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
JOB_OUTCOMES = ("succeeded", "failed", "outcome_unknown", "cancelled")


class OperatorCollector:
    """Job outcomes and RQ-queue waits per attempt, the live RQ side, paused domains (issue 12).

    Outcomes and waits are tailed from ``JobAttempt`` by ``finished_at`` (its index): each scrape counts the
    attempts that ended since the previous one, up to ``LAG_SECONDS`` ago, so an attempt whose end commits a
    moment after its ``clock_timestamp()`` is not skipped. The RQ-queue wait (``stage_sql.seconds_sql("rq")``) is
    observed when the attempt ends. Counting starts when this process starts.
    """

    LAG_SECONDS = 10.0

    def __init__(self, lag_seconds: float = LAG_SECONDS):
        self.lag = lag_seconds
        self._lock = threading.Lock()
        self._since = None  # database time up to which ended attempts are counted
        self._outcomes = {(d, o): 0 for d in domain_keys() for o in JOB_OUTCOMES}
        self._buckets: dict[str, list[int]] = {}  # domain -> count per bucket (+Inf last), not cumulative
        self._sums: dict[str, float] = {}
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT clock_timestamp() - make_interval(secs => %s)", [self.lag])
                self._since = cursor.fetchone()[0]
        finally:
            if not connection.in_atomic_block:
                connection.close()

    def _tail(self, cursor) -> None:

        cursor.execute(
            f"""
            WITH t AS (SELECT clock_timestamp() - make_interval(secs => %(lag)s) AS upto),
            a AS (
                SELECT a.domain, a.outcome, {stage_sql.seconds_sql("rq")} AS wait, t.upto
                FROM {ATTEMPT} a CROSS JOIN t
                WHERE a.finished_at > %(since)s AND a.finished_at <= t.upto
            )
            SELECT (SELECT upto FROM t), a.domain, a.outcome, width_bucket(a.wait, %(bounds)s::float8[]),
                   count(*), sum(a.wait)
            FROM a GROUP BY a.domain, a.outcome, width_bucket(a.wait, %(bounds)s::float8[])
            """,
            {"lag": self.lag, "since": self._since, "bounds": [float(b) for b in RQ_WAIT_BUCKETS]},
        )
        rows = cursor.fetchall()
        if not rows:
            cursor.execute("SELECT clock_timestamp() - make_interval(secs => %s)", [self.lag])
            self._since = max(self._since, cursor.fetchone()[0])
            return
        for upto, domain, outcome, bucket, count, wait_sum in rows:
            self._since = max(self._since, upto)
            if outcome in JOB_OUTCOMES:
                self._outcomes[(domain, outcome)] = self._outcomes.get((domain, outcome), 0) + count
            if bucket is not None:  # NULL: the attempt never started, no RQ-queue wait to observe
                counts = self._buckets.setdefault(domain, [0] * (len(RQ_WAIT_BUCKETS) + 1))
                # width_bucket: 0 below the first bound, i for bounds[i-1] <= wait < bounds[i], n above the last.
                counts[min(bucket, len(RQ_WAIT_BUCKETS))] += count
                self._sums[domain] = self._sums.get(domain, 0.0) + float(wait_sum or 0.0)

    def collect(self):
        import dispatch_app.actions.operator as actions
        import dispatch_app.rq.state.queues as rqside

        try:
            with self._lock, connection.cursor() as cursor:
                if self._since is not None:
                    self._tail(cursor)
                paused = actions.paused_domains(cursor)
                rq = rqside.snapshot()
        except Exception:
            log.exception(
                "metrics scrape could not read job attempts or the RQ side",
                extra={"action": "metrics_operator_error", "domain": "ops"},
            )
            return
        finally:
            if not connection.in_atomic_block:
                connection.close()
        yield from self._attempt_families(paused)
        yield from _rq_families(rq)

    def _attempt_families(self, paused) -> list:
        from prometheus_client.core import HistogramMetricFamily

        outcomes = CounterMetricFamily(
            "productflow_job_outcomes",
            "Jobs that ended, by domain and outcome (the attempt that ended the job), counted since this process "
            "started; from JobAttempt, trailing the database clock by 10 s.",
            labels=["domain", "outcome"],
        )
        for (domain, outcome), count in sorted(self._outcomes.items()):
            outcomes.add_metric([domain, outcome], count)
        waits = HistogramMetricFamily(
            "productflow_rq_queue_wait_seconds",
            "RQ-queue wait of each attempt (dispatched -> started, timeline.stages), observed when it ends.",
            labels=["domain"],
        )
        for domain in sorted({*domain_keys(), *self._buckets}):
            counts = self._buckets.get(domain, [0] * (len(RQ_WAIT_BUCKETS) + 1))
            cumulative, running = [], 0
            for bound, count in zip((*RQ_WAIT_BUCKETS, float("inf")), counts, strict=True):
                running += count
                cumulative.append(("+Inf" if bound == float("inf") else str(float(bound)), running))
            waits.add_metric([domain], cumulative, sum_value=self._sums.get(domain, 0.0))
        pause = GaugeMetricFamily(
            "productflow_domain_paused", "1 while an operator has paused dispatch of the domain.", labels=["domain"]
        )
        for domain in domain_keys():
            pause.add_metric([domain], 1 if domain in paused else 0)
        return [outcomes, waits, pause]


def _rq_families(rq: dict) -> list:
    up = GaugeMetricFamily("productflow_rq_up", "1 if the last scrape could read the RQ side from Redis.")
    up.add_metric([], 0 if rq["error"] else 1)
    if rq["error"]:
        return [up]
    # One series per lane (dispatch_app.domains.lanes): ``queue`` is the lane's RQ queue, ``lane`` its name.
    labels = ["queue", "lane"]
    depth = GaugeMetricFamily("productflow_rq_queue_depth", "Jobs waiting in the RQ queue.", labels=labels)
    live = GaugeMetricFamily("productflow_rq_live_workers", "Live RQ workers listening on the queue.", labels=labels)
    oldest = GaugeMetricFamily(
        "productflow_rq_oldest_job_age_seconds",
        "Seconds since the job at the head of the RQ queue was dispatched (database clock); 0 if empty.",
        labels=labels,
    )
    for _, q in sorted(rq["queues"].items()):
        for lane, seen in q["lanes"].items():
            depth.add_metric([seen["queue"], lane], seen["depth"])
            live.add_metric([seen["queue"], lane], seen["live_workers"])
            oldest.add_metric([seen["queue"], lane], seen["oldest_wait"] or 0.0)
    return [up, depth, live, oldest]
