"""PipelineWorker: RQ's in-process worker with the round trips this pipeline does not need taken out.

Per job, RQ's SimpleWorker makes ~20 Redis round trips (heartbeats several times
per job, separate pipelines for the execution, the start, the end, the state).
This subclass keeps RQ's data model (queues, job hashes, executions, the
started/finished/failed registries, worker hashes and counters) and writes it
in fewer, larger transactions:

- one script call takes up to WORKER_PREFETCH ready jobs and their hashes
  (``fetch.Fetcher``), moving each to the queue's intermediate list as RQ does;
- one MULTI/EXEC per job writes the previous job's end *and* this job's start
  (status, worker name, execution, started registry), so the registries move
  from one true state to the next and the start is in Redis before the job runs;
- an idle worker woken by a job writes that job's start in the take's script call
  (``fetch.Start``): from "a job arrived" to "started in Redis" is one round trip;
- the heartbeat runs on its own thread once per interval (``beat.Heartbeat``);
- a success stores no result payload (PostgreSQL is the record): the job's
  status, end time, finished registry entry and the worker's counters remain.

The late lanes' share is ``lane_share``; the end writes are ``writes``; every RQ internal this class
overrides or calls is listed (and checked at start-up) in ``dispatch_app.rq.internals``.

Failures, retries, callbacks and dependents go through RQ's own code. The
loop survives Redis outages (waits, reconnects with backoff) instead of exiting.
"""

from __future__ import annotations

import copy
import logging
import signal
import sys
import threading
import time

import redis
from rq.exceptions import DeserializationError, StopRequested
from rq.job import Retry
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException
from rq.utils import now, utcformat
from rq.worker import SimpleWorker
from rq.worker_registration import register

import dispatch_app.execution.start_protocol as prestart
import dispatch_app.rq.current as current
import dispatch_app.rq.internals as rq_internals
import dispatch_app.rq.worker.admission as admission
import dispatch_app.rq.worker.fast_paths as fast_paths
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.config.tuning import (
    HOLD_SECONDS,
    IDLE_WAIT_SECONDS,
    JOB_SECONDS_WEIGHT,
    PREFETCH_WAIT_BUDGET,
    RESCUE_SECONDS,
)
from dispatch_app.rq.worker.beat import Heartbeat, start_beacon
from dispatch_app.rq.worker.fetch import Fetcher, Suspended, Taken
from dispatch_app.rq.worker.lane_share import LaneShare, with_lanes
from dispatch_app.rq.worker.maintenance import MaintenanceMixin
from dispatch_app.rq.worker.outage import BAD_REPLY, OutageMixin
from dispatch_app.rq.worker.project_job import ProjectJob
from dispatch_app.rq.worker.reports import EvidenceMixin
from dispatch_app.rq.worker.start_template import StartTemplate
from dispatch_app.rq.worker.starts import StartsMixin
from dispatch_app.rq.worker.writes import WritesMixin

log = logging.getLogger("dispatch_app.rqworker")


class PipelineWorker(WritesMixin, StartsMixin, EvidenceMixin, OutageMixin, MaintenanceMixin, SimpleWorker):
    def __init__(
        self,
        queues,
        *args,
        prefetch: int | None = None,
        heartbeat_interval: float | None = None,
        late_lanes: bool = True,
        **kwargs,
    ):
        # JSON always, whatever a launcher passes (rqworker's --serializer, queue objects with their own): a pickle
        # planted in a hash's data, meta or result is never unpickled, and our publisher writes JSON.
        kwargs["serializer"] = JSONSerializer
        queues = list(queues) if isinstance(queues, list | tuple) else [queues]
        for i, queue in enumerate(queues):
            if not isinstance(queue, str) and queue.serializer is not JSONSerializer:
                queues[i] = copy.copy(queue)  # the caller's object stays as it was
                queues[i].serializer = JSONSerializer
        # Every hash RQ's own code reads here is read as ProjectJob: unreadable is missing, no callback imported.
        if not (isinstance(kwargs.get("job_class"), type) and issubclass(kwargs["job_class"], ProjectJob)):
            kwargs["job_class"] = ProjectJob
        rq_internals.verify()  # an RQ without what this class overrides or calls fails here, by name
        fast_paths.install()
        # Started by another launcher (rq's WorkerPool, a test): the DISPATCH settings.
        conf = dispatch_settings()
        self.prefetch = prefetch or conf.WORKER_PREFETCH
        self.heartbeat_interval = heartbeat_interval or conf.WORKER_HEARTBEAT_INTERVAL
        self.reconnect_backoff_max = conf.RECONNECT_BACKOFF_MAX
        self._stopping = threading.Event()
        self._buffer: list[tuple[Taken, float]] = []
        self._pending: tuple | None = None  # (job, queue, execution) ended, not yet written
        self._pending_fields: dict[str, str] = {}
        self._recent = ""
        self._undeserializable = 0
        self._told_undeserializable = False
        self._job_seconds = 0.0
        self._beat: Heartbeat | None = None
        self._rescue_at = 0.0
        self._fetcher: Fetcher | None = None
        self._timeouts: dict[str, int | None] = {}  # queue -> its last job's timeout (``_record_start``)
        self._start_templates: dict[tuple, StartTemplate | None] = {}
        self._in_doubt: tuple | None = None  # (popped, start) of a take whose reply was lost
        self._held: prestart.Held | None = None  # a start made ahead of its take, until the job runs
        self.lane_share = LaneShare(conf.RECOVERY_LANE_EVERY)
        # late_lanes=False: a domain queue named brings its new lane alone (runworkers --new-lanes-only), its
        # recovered work left to workers of its own.
        super().__init__(with_lanes(queues) if late_lanes else list(queues), *args, **kwargs)

    # --- connection and lifecycle -------------------------------------------------
    def _set_connection(self, connection):
        # RQ raises socket_timeout to the dequeue timeout (~7 min); the idle wait here is
        # short, so every Redis call keeps the timeout from REDIS_URL and an outage shows.
        return connection

    @property
    def dequeue_timeout(self) -> int:
        return 1

    def get_heartbeat_ttl(self, job, working_time: float = 0.0) -> int:
        # The execution and its started-registry entry outlive the job's timeout, as in RQ.
        return int(job.timeout or self.queue_class.DEFAULT_TIMEOUT) + 60

    def heartbeat(self, timeout=None, pipeline=None):
        """RQ calls this from a few places (suspension checks); the same short TTL as the beat thread."""
        self.last_heartbeat = now()
        conn = pipeline if pipeline is not None else self.connection
        conn.hset(self.key, "last_heartbeat", utcformat(self.last_heartbeat))
        conn.expire(self.key, self._beat.ttl if self._beat else self.worker_ttl + 60)

    def reregister(self, ttl: int) -> None:
        """Write the whole worker hash again (it expired, or Redis lost its data)."""
        mapping = {
            **self.serialize(),
            "state": self.get_state(),
            "successful_job_count": self.successful_job_count,
            "failed_job_count": self.failed_job_count,
            **self._health_fields(),
        }
        with self.connection.pipeline() as pipe:
            pipe.hset(self.key, mapping={k: v for k, v in mapping.items() if v is not None})
            register(self, pipe)
            pipe.expire(self.key, ttl)
            pipe.execute()

    def bootstrap(self, logging_level="INFO", date_format=None, log_format=None):
        kwargs = {k: v for k, v in (("date_format", date_format), ("log_format", log_format)) if v}
        self._retrying(lambda: self._step("junk values", None, self._reset_junk), "worker_start")  # before its birth
        self._retrying(lambda: super(PipelineWorker, self).bootstrap(logging_level, **kwargs), "worker_start")
        self._fetcher = Fetcher(self.connection, self._ordered_queues, self.job_class, self.serializer, self.name)
        self.lane_share.has_late = self._fetcher.has_late
        self._beat = Heartbeat(self, self.heartbeat_interval)
        self._beat.start()
        # Its PostgreSQL session says "alive" to recovery and the dashboard; a kill ends it at once (beat.py).
        self._beat.beacon = start_beacon(self)

    def teardown(self):
        if self._beat is not None:
            self._beat.stop()
        self._drop_held("the worker stopped before running it")
        try:
            self._flush_pending()
            if self._fetcher is not None:
                self._fetcher.give_back([t for t, _ in self._buffer])
            self._buffer.clear()
        except redis.RedisError as exc:
            log.warning(
                "worker %s: Redis unavailable or refusing at shutdown (%s); taken jobs are left to RQ's maintenance",
                self.name,
                exc,
                extra={"action": "worker_teardown_redis_down", "domain": "worker"},
            )
        try:
            super().teardown()
        except redis.RedisError:
            self.unsubscribe()  # the hash expires on its own; nothing else to release
        if self._beat is not None and self._beat.beacon is not None:
            self._beat.beacon.stop()  # last: the hash says "died" (or is gone) before the session does

    # --- signals ---------------------------------------------------------------------
    def request_stop(self, signum, frame):
        """Warm shutdown: the job in hand finishes, taken jobs go back, then the worker exits.

        Never raises from the signal handler: an exception here could land between a
        job's side effect and the write that records it.
        """
        self._shutdown_requested_date = now()
        self._stop_requested = True
        self._stopping.set()
        signal.signal(signal.SIGINT, self.request_force_stop)
        signal.signal(signal.SIGTERM, self.request_force_stop)
        log.info(
            "worker %s: warm shutdown requested; finishing the current job",
            self.name,
            extra={"action": "worker_stop_requested", "domain": "worker"},
        )

    # --- the loop ----------------------------------------------------------------------
    def work(self, burst=False, logging_level=None, date_format=None, log_format=None, max_jobs=None, **_ignored):
        """RQ's work() contract (returns whether any job ran); ``with_scheduler`` etc. are not used."""
        self.bootstrap(logging_level or "INFO", date_format, log_format)
        self._install_signal_handlers()
        completed = 0
        try:
            while not self._stop_requested:
                try:
                    if self.should_run_maintenance_tasks:
                        self._maintain()
                    if time.monotonic() >= self._rescue_at:
                        self._rescue_orphans()
                    limit = self._take_limit()
                    if max_jobs is not None:
                        limit = min(limit, max_jobs - completed)
                    item = self._next(limit, burst)
                    if item is None:
                        if burst:
                            break
                        continue
                    self._run(item)
                    completed += 1
                    if max_jobs is not None and completed >= max_jobs:
                        log.info(
                            "worker %s: %d jobs done, exiting (--max-jobs)",
                            self.name,
                            completed,
                            extra={"action": "worker_max_jobs", "domain": "worker"},
                        )
                        break
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    self._redis_down(exc)
                except BAD_REPLY as exc:  # junk anyone may write into Redis: logged, reset, never the end (outage)
                    self._bad_reply(exc)
                except StopRequested:
                    break
        finally:
            self.teardown()
        return bool(completed)

    def _next(self, limit: int, burst: bool) -> Taken | None:
        """The next job to run: from the batch in hand, else a fresh batch, else wait (not in burst)."""
        if self._buffer:
            taken, at = self._buffer[0]
            if time.monotonic() - at <= HOLD_SECONDS:
                self._buffer.pop(0)
                return taken
            self._fetcher.give_back([t for t, _ in self._buffer])
            for t, _ in self._buffer:
                self._drop_held("it waited in the worker's hand too long and went back to its queue", t.job.id)
            self._buffer.clear()
        late_first = self.lane_share.late_due()
        limit = self.lane_share.limit(limit)
        try:
            batch = self._fetcher.take(limit, late_first=late_first)
        except Suspended:
            self._flush_pending()
            self.check_for_suspension(burst)
            return None
        if not batch:
            self._flush_pending(idle=True)
            batch = None
            if burst:
                return None
            popped = self._fetcher.wait(self._idle_wait())
            if popped is None:
                return None
            start = self._record_start(popped)
            late_first = self.lane_share.late_due()
            pending = self._fetcher.send_take(limit, popped, start, late_first=late_first)
            if pending.error is None:
                # The job's start in PostgreSQL while Redis runs the take (prestart).
                self._held = prestart.begin(self.name, popped[1], self._fetcher.queues[popped[0]].name)
            try:
                batch = pending.result()
            except (redis.ConnectionError, redis.TimeoutError):
                # The script may have run, its reply lost: settled once Redis answers (``_redis_down``).
                self._in_doubt = (popped, start)
                raise
            finally:
                if start is not None and not (batch and batch[0].execution is not None):
                    self._state = start.state  # not written: the next start writes BUSY again
            if not (batch and batch[0].job.id == popped[1]):
                self._drop_held("its job's hash was gone from Redis when the worker took it")
            if not batch:
                return None
        self.lane_share.count([taken.queue.name for taken in batch], late_first)
        at = time.monotonic()
        self._buffer = [(t, at) for t in batch[1:]]
        return batch[0]

    def _take_limit(self) -> int:
        """How many ready jobs to take at once (``PREFETCH_WAIT_BUDGET``); all of WORKER_PREFETCH before any ran."""
        if not self._job_seconds:
            return self.prefetch
        return max(1, min(self.prefetch, 1 + int(PREFETCH_WAIT_BUDGET / self._job_seconds)))

    def _ran(self, seconds: float) -> None:
        w = JOB_SECONDS_WEIGHT
        self._job_seconds = seconds if not self._job_seconds else (1 - w) * self._job_seconds + w * seconds

    def _idle_wait(self) -> float:
        timeout = self.connection.connection_pool.connection_kwargs.get("socket_timeout")
        return IDLE_WAIT_SECONDS if not timeout else max(0.1, min(IDLE_WAIT_SECONDS, timeout / 2))

    def _run(self, taken: Taken) -> None:
        job, queue = taken.job, taken.queue
        # Before anything of the job is imported, called or believed (its timeout included): is it ours?
        verdict = admission.check(job, queue.name, taken.unreadable)
        if verdict.refused:
            self._drop_held(verdict.why, job.id)
            admission.refuse(self, taken, verdict)
            return
        self._timeouts[queue.name] = job.timeout
        try:
            job.func_name  # noqa: B018 - deserialises the call; a foreign job fails here, before any start
        except DeserializationError as exc:
            self._drop_held("its data in Redis could not be deserialised", job.id)
            self._undeserializable_job(taken, exc)
            return
        if self._held is not None and self._held.rq_id == job.id:
            if self._held.domain not in verdict.admitted:  # two domains on one queue: it names the other's entry
                self._drop_held("its function is another domain's entry point", job.id)
            else:
                setattr(job, current.START_ATTRIBUTE, self._held)  # handed over with the job: execute takes it
                self._held = None
        try:
            return self._perform(taken)
        finally:
            left = getattr(job, current.START_ATTRIBUTE, None)  # its function ended before it took the start
            if left is not None:
                setattr(job, current.START_ATTRIBUTE, None)
                prestart.withdraw(left, "its function ended before it took the start")

    def _perform(self, taken: Taken) -> None:
        job, queue = taken.job, taken.queue
        if job.repeats_left is not None:
            # Repeating jobs need RQ's scheduling on success: RQ's own path, unbatched.
            self._flush_pending()
            return super().execute_job(job, queue)

        execution = taken.execution
        if execution is not None:
            self.executions[execution.id] = execution
        else:
            try:
                execution = self._write_start(job, queue)
            except redis.RedisError:
                # Not started: it goes back to its queue with the rest once Redis answers (or its junk is reset).
                self._buffer.insert(0, (taken, time.monotonic()))
                raise
        started = time.monotonic()
        job.started_at = now()
        try:
            timeout = job.timeout or self.queue_class.DEFAULT_TIMEOUT
            with self.death_penalty_class(timeout, JobTimeoutException, job_id=job.id):
                return_value = job.perform()
        except Exception:
            self._ran(time.monotonic() - started)
            self._outcome("f")
            self.failed_job_count += 1
            self._finalize_failure(job, queue, execution, sys.exc_info())
            return
        self._ran(time.monotonic() - started)
        job.ended_at = now()
        rq_internals.set_result(job, return_value)
        if isinstance(return_value, Retry) or job.success_callback:
            # Retries and success callbacks: RQ's own handling, one job at a time.
            self._outcome("f" if isinstance(return_value, Retry) else "s")
            return self._finalize_success(job, queue, execution, return_value)
        self._outcome("s")
        self._pending = (job, queue, execution)

    def _drop_held(self, why: str, rq_id: str | None = None) -> None:
        """Withdraw the start made ahead of the take (prestart) when its job will not run here."""
        held = self._held
        if held is not None and (rq_id is None or held.rq_id == rq_id):
            self._held = None
            prestart.withdraw(held, why)

    def _rescue_orphans(self) -> None:
        """At start-up and then every RESCUE_SECONDS: return jobs that dead workers took but never started."""
        self._rescue_at = time.monotonic() + RESCUE_SECONDS
        moved = self._fetcher.rescue()
        if moved:
            log.warning(
                "worker %s: %d job(s) taken by a dead worker and never started went back to their queues",
                self.name,
                moved,
                extra={"action": "worker_rescued_taken_jobs", "domain": "worker"},
            )
