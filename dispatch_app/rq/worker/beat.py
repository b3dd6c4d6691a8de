"""The worker's heartbeat on its own thread: once per interval, whatever the jobs do.

RQ's worker writes its heartbeat from the job loop, several times per job, and
not at all while a job runs in-process. Here a thread keeps the worker hash
alive on a fixed period with a short TTL, so the hash says "alive" exactly while
the process is (recovery's evidence: dispatch_app.recovery.evidence.worker_alive),
and a killed worker is seen dead within a few periods instead of the job
timeout + 60 s.

Sooner still: the worker holds a PostgreSQL session named for it
(``dispatch_app.db.liveness.Beacon``) and writes where it is into its hash
(``SESSION_FIELD``, at once and with every beat); a kill ends that session at
once, and recovery and the dashboard read that first.
"""

from __future__ import annotations

import logging
import math
import threading

import redis
from rq.utils import now, utcformat

import dispatch_app.db.liveness as liveness
import dispatch_app.rq.deployment as deployment
import dispatch_app.rq.junk as junk
from dispatch_app.config.tuning import MIN_TTL_SECONDS, TTL_PERIODS

log = logging.getLogger("dispatch_app.rqworker")

SESSION_FIELD = liveness.WORKER_HASH_FIELD


def ttl_seconds(interval: float) -> int:
    return max(MIN_TTL_SECONDS, math.ceil(interval * TTL_PERIODS))


class Heartbeat(threading.Thread):
    def __init__(self, worker, interval: float):
        super().__init__(name=f"heartbeat-{worker.name}", daemon=True)
        self.worker = worker
        self.interval = interval
        self.ttl = ttl_seconds(interval)
        self.stopping = threading.Event()
        self._failing = False
        self.beacon: liveness.Beacon | None = None

    def run(self) -> None:
        while True:
            self.run_once()
            if self.stopping.wait(self.interval):
                return

    def run_once(self) -> bool:
        try:
            self.beat()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if not self._failing:
                log.warning(
                    "worker %s: heartbeat failed (%s); retrying every %ss",
                    self.worker.name,
                    exc,
                    self.interval,
                    extra={"action": "worker_heartbeat_failed", "domain": "worker"},
                )
            self._failing = True
            return False
        except redis.ResponseError as exc:  # its hash made a string, a counter made junk: reset, registered again
            self._reset_junk(exc)
            return False
        except Exception:  # a bug here must not end the beat: the worker would look dead
            log.exception(
                "worker %s: heartbeat error",
                self.worker.name,
                extra={"action": "worker_heartbeat_error", "domain": "worker"},
            )
            return False
        if self._failing:
            log.info(
                "worker %s: heartbeat restored",
                self.worker.name,
                extra={"action": "worker_heartbeat_restored", "domain": "worker"},
            )
        self._failing = False
        return True

    def _reset_junk(self, exc: Exception) -> None:
        """Junk in its keys (anyone on Redis's network may write it): the keys it writes put right, then its hash
        and registry entries written whole again, so the dashboard and recovery see it alive."""
        worker = self.worker
        log.warning(
            "worker %s: Redis refused its heartbeat (%s); resetting its keys and registering it again",
            worker.name,
            str(exc)[:300],
            extra={"action": "worker_heartbeat_bad_reply", "domain": "worker"},
        )
        try:
            keys = junk.worker_keys(worker.queues, worker.name)
            junk.reset(worker.connection, keys, {worker.key: junk.WORKER_COUNTERS})
            worker.reregister(self.ttl)  # whole again, in every registry it was kept out of
        except redis.RedisError:  # the server itself refuses (READONLY, OOM): the next beat tries again
            pass

    def beat(self) -> None:
        worker = self.worker
        worker.last_heartbeat = now()
        with worker.connection.pipeline(transaction=False) as pipe:
            pipe.hset(worker.key, "last_heartbeat", utcformat(worker.last_heartbeat))
            pipe.expire(worker.key, self.ttl)
            pipe.expire(worker.executions_key, self.ttl)
            claim = self.beacon.claim if self.beacon is not None and self.beacon.connected.is_set() else None
            if claim:
                pipe.hset(worker.key, SESSION_FIELD, claim)  # again each beat: Redis may have lost the hash
            created = pipe.execute()[0]
        if created:
            # The hash was gone (it expired, or Redis lost its data): write it whole again,
            # or dashboards would show a worker with nothing but a heartbeat.
            worker.reregister(self.ttl)
        deployment.keep_alive()  # this deployment's entry on its Redis servers (dispatch_app.rq.deployment)

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)


def start_beacon(worker) -> liveness.Beacon:
    """The worker's liveness session; it writes where it is into the worker hash as soon as it connects."""

    def publish(claim: str) -> None:
        worker.connection.hset(worker.key, SESSION_FIELD, claim)

    beacon = liveness.Beacon(liveness.tag(liveness.WORKER, worker.name), liveness.django_conninfo, on_connect=publish)
    beacon.start()
    return beacon
