"""Every RQ internal the project relies on, named in one place, with what we rely on it for.

RQ is pinned (``rq==3.0.0``), but the project reaches past its public API in a few places: the
``PipelineWorker`` overrides private worker methods and sets private worker state, the publisher
calls ``Queue._prepare_for_queue``, ``fast_paths.install`` replaces RQ module globals, the take and
enqueue Lua scripts move RQ's keys the way RQ's own code does, and the operator pages read RQ's keys
directly. ``INTERNALS`` lists each of these (where RQ defines it, what it must look like, why we
need it); ``problems()`` checks them against the installed RQ and ``verify()`` raises
``RQContractError`` naming every one that changed. A worker calls ``verify()`` before it starts,
so an RQ upgrade fails loudly at start-up instead of misbehaving; ``tests/unit/test_rq_contract.py``
runs the same check in CI.

Code outside this module reaches RQ's private names through the accessors below
(``prepare_for_queue``, ``set_status``, ...) or, for the worker's own overridden methods and
inherited state, names them here in ``INTERNALS``. This module imports only RQ (a leaf).
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from functools import cache

from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.queue import Queue
from rq.scripts import UNIQUE_ENQUEUE_SCRIPT
from rq.suspension import WORKERS_SUSPENDED
from rq.worker import Worker
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

SEE = "see dispatch_app/rq/internals.py"


class RQContractError(RuntimeError):
    """The installed RQ lacks, or changed, an internal this project relies on."""


@dataclass(frozen=True)
class Internal:
    """One RQ internal: ``path`` is ``module:Qualified.name``.

    kind: ``method``/``function`` (callable; ``params`` are its leading parameter names, ``self``
    included), ``attribute`` (state an instance sets in RQ's code: ``self.<name> =`` in the
    defining module), ``global`` (a module-level name we read or replace), ``value`` (a constant
    whose value is part of the contract: ``expected``).
    """

    path: str
    kind: str
    relied_on: str
    params: tuple[str, ...] = ()
    expected: object = None
    called_by_rq: bool = False  # an override: RQ's own code must still call it (``self.<name>(`` in its module)

    @property
    def name(self) -> str:
        return self.path.split(":")[1].rsplit(".", 1)[-1]


_BASE = "rq.worker.base:BaseWorker"
# The RQ modules that import ``resolve_serializer`` by name (rq 2.x/3.x), for ``fast_paths.install``.
# ``rq.serializers`` goes first: one of these imported later then takes the fast path from it.
SERIALIZER_MODULES = ("rq.serializers", "rq.job", "rq.queue", "rq.registry", "rq.results", "rq.scheduler", "rq.cron")
# ``str_to_date`` (rq.job) looks ``utcparse`` up in rq.utils; the scheduler imports it by name.
UTCPARSE_MODULES = ("rq.utils", "rq.scheduler")
_JOB_PARAMS = ("self", "job", "queue", "execution")

INTERNALS: tuple[Internal, ...] = (
    # -- PipelineWorker overrides these private methods (rqworker/worker.py); RQ must still call them by these names.
    Internal(
        f"{_BASE}._set_connection",
        "method",
        "overridden: keep REDIS_URL's socket timeout instead of RQ raising it to the dequeue timeout",
        ("self", "connection"),
        called_by_rq=True,
    ),
    # -- ... and calls these private methods with these arguments.
    Internal(f"{_BASE}._install_signal_handlers", "method", "work() installs RQ's SIGINT/SIGTERM handling", ("self",)),
    Internal(
        f"{_BASE}._finalize_failure",
        "method",
        "a failed job goes through RQ's failure path (registries, retries, callbacks)",
        (*_JOB_PARAMS, "exc_info"),
    ),
    Internal(
        f"{_BASE}._finalize_success",
        "method",
        "a Retry return value or a success callback goes through RQ's success path",
        (*_JOB_PARAMS, "return_value"),
    ),
    Internal(
        f"{_BASE}._enqueue_dependents_safely",
        "method",
        "a finished job's dependents are enqueued by RQ's code",
        ("self", "queue", "job"),
    ),
    # -- RQ's maintenance, run by maintenance.MaintenanceMixin with hashes read as ProjectJob (project_job.py).
    Internal(
        f"{_BASE}.clean_registries",
        "method",
        "overridden: hashes read as ProjectJob, the queue's lock released when a step raises",
        ("self",),
        called_by_rq=True,
    ),
    Internal(f"{_BASE}.run_maintenance_tasks", "method", "work() runs RQ's maintenance through it", ("self",)),
    Internal(f"{_BASE}._exc_handlers", "attribute", "the started registry's cleanup calls them (exception_handlers)"),
    Internal("rq.registry:clean_registries", "function", "each queue's registries", ("queue", "exception_handlers")),
    Internal("rq.worker_registration:clean_worker_registry", "function", "each queue's worker set", ("queue",)),
    Internal(
        "rq.intermediate_queue:IntermediateQueue.cleanup",
        "method",
        "jobs stuck in a queue's intermediate list",
        ("self", "worker", "queue"),
    ),
    Internal("rq.job:Job.refresh", "method", "overridden (ProjectJob): Job.fetch reads a hash through it", ("self",)),
    *(
        Internal(f"rq.job:Job.{name}_callback", "global", "overridden (ProjectJob): never import a name Redis holds")
        for name in ("success", "failure", "stopped")
    ),
    Internal(
        "rq.job:Job.send_webhooks",
        "method",
        "overridden (ProjectJob): no URL Redis holds is called",
        ("self", "status"),
    ),
    # -- Public worker methods whose exact signature the batched writes depend on (worker.py, starts.py).
    Internal(f"{_BASE}.cleanup_execution", "method", "the end write", ("self", "job", "pipeline", "execution")),
    Internal(f"{_BASE}.increment_total_working_time", "method", "the end write", ("self", "job_execution_time")),
    Internal(f"{_BASE}.increment_successful_job_count", "method", "the end write", ("self", "pipeline")),
    Internal(f"{_BASE}.set_state", "method", "the start write, on a pipeline", ("self", "state", "pipeline")),
    Internal(f"{_BASE}.get_heartbeat_ttl", "method", "overridden: the execution's TTL", ("self", "job")),
    Internal(f"{_BASE}.heartbeat", "method", "overridden: one short TTL", ("self", "timeout", "pipeline")),
    Internal(f"{_BASE}.request_stop", "method", "overridden: warm shutdown", ("self", "signum", "frame")),
    Internal(f"{_BASE}.check_for_suspension", "method", "called when a take finds rq suspend", ("self", "burst")),
    # -- Private state of RQ objects the worker reads or writes (set by RQ's own code, never by a setter).
    Internal(f"{_BASE}._state", "attribute", "the worker's state without a Redis read (starts.py)"),
    Internal(f"{_BASE}._stop_requested", "attribute", "the loop's stop flag, set by request_stop"),
    Internal(f"{_BASE}._shutdown_requested_date", "attribute", "set by request_stop as RQ's does"),
    Internal(f"{_BASE}._ordered_queues", "attribute", "the queues in RQ's order, for the Fetcher"),
    Internal("rq.job:Job._status", "attribute", "a job's status in hand without a Redis read (set_status)"),
    Internal("rq.job:Job._result", "attribute", "the return value RQ's success path reads (set_result)"),
    Internal("rq.executions:Execution._job", "attribute", "an execution's job, without a Redis read"),
    Internal("rq.queue:Queue._default_timeout", "attribute", "the timeout a start assumes (default_timeout)"),
    Internal(
        "rq.queue:Queue._prepare_for_queue",
        "method",
        "the publisher sets origin, enqueued_at, timeout and status as Queue.enqueue does",
        ("self", "job"),
    ),
    # -- Module globals fast_paths.install() replaces (each module that imports the name binds its own copy).
    *(
        Internal(f"{m}:resolve_serializer", "global", "replaced by fast_paths.resolve_serializer")
        for m in SERIALIZER_MODULES
    ),
    *(Internal(f"{m}:utcparse", "global", "replaced by fast_paths.utcparse") for m in UTCPARSE_MODULES),
    Internal("rq.utils:utcformat", "function", "its layout is what fast_paths.utcparse reads fast", ("dt",)),
    Internal("rq.rate_limit:release_slot", "function", "the end write releases the job's slot", ("job",)),
    # -- The enqueue script the publisher wraps (publisher.CREATE_IF_ABSENT): its KEYS/ARGV layout.
    Internal("rq.scripts:UNIQUE_ENQUEUE_SCRIPT", "global", "KEYS[1] job, KEYS[2] queue, ARGV[1..3] id/side/ttl"),
    # -- Redis key formats RQ owns, read or written directly by the take/rescue scripts and the operator pages.
    Internal("rq.queue:Queue.redis_queue_namespace_prefix", "value", "queue lists", expected="rq:queue:"),
    Internal("rq.job:Job.redis_job_namespace_prefix", "value", "job hashes", expected="rq:job:"),
    Internal("rq.worker:Worker.redis_worker_namespace_prefix", "value", "worker hashes", expected="rq:worker:"),
    Internal("rq.worker_registration:WORKERS_BY_QUEUE_KEY", "value", "workers per queue", expected="rq:workers:%s"),
    Internal("rq.suspension:WORKERS_SUSPENDED", "value", "the take script's first key", expected="rq:suspended"),
    Internal("rq.job:JobStatus.QUEUED", "value", "the Lua scripts compare status to it", expected="queued"),
    Internal("rq.job:JobStatus.STARTED", "value", "the Lua scripts compare status to it", expected="started"),
    Internal(
        "rq.intermediate_queue:IntermediateQueue.get_intermediate_queue_key",
        "function",
        "a taken job waits in <queue key>:intermediate, as RQ's BLMOVE puts it",
        ("queue_key",),
    ),
)

# The enqueue script's contract, as its own comments state it (publisher.CREATE_IF_ABSENT relies on it).
# Its reply on success is replaced (publisher.CREATE_IF_ABSENT says when it created in place of a foreign hash).
UNIQUE_ENQUEUE_SUCCESS = "return 1  -- Success"
UNIQUE_ENQUEUE_LINES = (
    "KEYS[1] = job key",
    "KEYS[2] = queue key",
    "ARGV[1] = job_id",
    "ARGV[2] = push direction",
    "ARGV[4+] = field1, value1",
    UNIQUE_ENQUEUE_SUCCESS,
)


def _resolve(path: str):
    module_name, qualname = path.split(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _owner(path: str):
    module_name, qualname = path.split(":")
    owner = importlib.import_module(module_name)
    for part in qualname.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner


def problem(item: Internal) -> str | None:
    """What changed about one internal in the installed RQ, or None."""
    try:
        if item.kind == "attribute":
            return _attribute_problem(item)
        obj = _resolve(item.path)
    except (ImportError, AttributeError) as exc:
        return f"RQ changed: {item.path} is missing ({exc}); we rely on it for: {item.relied_on}; {SEE}"
    except (OSError, TypeError) as exc:  # no source to read
        return f"RQ changed: {item.path} cannot be checked ({exc}); {SEE}"
    if item.kind in ("method", "function"):
        if not callable(obj):
            return f"RQ changed: {item.path} is no longer callable; we rely on it for: {item.relied_on}; {SEE}"
        names = tuple(inspect.signature(obj).parameters)
        if names[: len(item.params)] != item.params:
            return (
                f"RQ changed: {item.path} takes {names}, we call it with {item.params}; "
                f"we rely on it for: {item.relied_on}; {SEE}"
            )
    if item.called_by_rq and f"self.{item.name}(" not in inspect.getsource(inspect.getmodule(_owner(item.path))):
        return f"RQ changed: {item.path} is no longer called by RQ's code; our override of it does nothing; {SEE}"
    if item.kind == "value" and obj != item.expected:
        return f"RQ changed: {item.path} is {obj!r}, we assume {item.expected!r} ({item.relied_on}); {SEE}"
    return None


def _attribute_problem(item: Internal) -> str | None:
    owner = _owner(item.path)
    source = inspect.getsource(inspect.getmodule(owner))
    if re.search(rf"self\.{re.escape(item.name)}\s*(:[^=\n]*)?=[^=]", source) is None:
        return f"RQ changed: {item.path} is no longer set by RQ's code; we rely on it for: {item.relied_on}; {SEE}"
    return None


def problems(internals: tuple[Internal, ...] | None = None) -> list[str]:
    """Every listed internal (``INTERNALS`` by default) that changed, and the enqueue script's layout."""
    found = [p for p in map(problem, INTERNALS if internals is None else internals) if p is not None]
    for line in UNIQUE_ENQUEUE_LINES:
        if line not in UNIQUE_ENQUEUE_SCRIPT:
            found.append(f"RQ changed: rq.scripts:UNIQUE_ENQUEUE_SCRIPT no longer says {line!r}; {SEE}")
    return found


@cache
def verify() -> None:
    """Raise ``RQContractError`` naming every listed internal the installed RQ lacks or changed (once)."""
    found = problems()
    if found:
        raise RQContractError("\n".join(found))


# --- accessors: the other modules touch RQ's private names only through these ---------------------------


def prepare_for_queue(queue: Queue, job: Job) -> None:
    """What ``Queue.enqueue`` does to a job before writing it (origin, enqueued_at, timeout, status)."""
    queue._prepare_for_queue(job)


def set_status(job: Job, status: str) -> None:
    """The job's status in hand, where a write already put it in Redis (no second write)."""
    job._status = status


def exception_handlers(worker) -> list:
    return worker._exc_handlers


def set_result(job: Job, value) -> None:
    job._result = value


def attach_job(execution, job: Job) -> None:
    """The execution's job, so RQ's code does not read it back from Redis."""
    execution._job = job


def default_timeout(queue: Queue):
    return queue._default_timeout


def job_key_prefix() -> str:
    return Job.redis_job_namespace_prefix


def worker_key_prefix() -> str:
    return Worker.redis_worker_namespace_prefix


def queue_key(name: str) -> str:
    return Queue.redis_queue_namespace_prefix + name


def job_key(rq_id: str) -> str:
    return Job.redis_job_namespace_prefix + rq_id


def intermediate_key(queue_key: str) -> str:
    return IntermediateQueue.get_intermediate_queue_key(queue_key)


def workers_of_queue_key(name: str) -> str:
    return WORKERS_BY_QUEUE_KEY % name


SUSPENDED_KEY = WORKERS_SUSPENDED
