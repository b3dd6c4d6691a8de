"""A job's start writes from a template: RQ's own writes, recorded once per (queue, timeout, worker state).

RQ's start (``Execution.create``, ``Job.prepare_for_execution``, the worker's
busy state) builds several RQ objects per job: ~140 µs of client CPU per job on
a slow host, on every job's way from "taken" to "started". Between two jobs of
one queue and timeout those writes differ only in the job id, the execution id
(a fresh ``uuid4().hex``) and the clock, so they are recorded once with RQ's
own code on a stand-in job, and each job's writes are that recording with the
three substituted.

The clock, as RQ writes it: floats are ``now().timestamp()`` (the execution's
times), integers of 10^9 and more are epoch seconds plus a TTL (registry
scores), strings in ``utcformat``'s layout are ``now()`` (the job hash's
times). The model is checked when a template is built: two recordings, for two
different job ids, must give the same template, and no clock value may fall
outside the moment it was recorded in. Anything else that varied (a field
derived from the id, a random token) fails the check: ``build`` returns None
and that start is written by RQ's code, job by job, as before.
"""

from __future__ import annotations

import datetime
import time
import uuid
from dataclasses import dataclass

from rq.executions import Execution
from rq.utils import utcformat

from dispatch_app.config.tuning import RECORD_TRIES
from dispatch_app.rq.worker.fast_paths import _RQ_LAYOUT, utcparse

EPOCH_SECONDS = 10**9  # integers from here on are epoch seconds (2001-09-09 onwards)

JOB, EXECUTION, FLOAT_NOW, INT_NOW, ISO_NOW = "job", "execution", "float", "int", "iso"


@dataclass(frozen=True)
class Rendered:
    """One job's start: the commands, its execution, and the start time the writes set (job.started_at)."""

    commands: list[tuple]
    execution: Execution
    at: datetime.datetime


class TemplateMismatch(Exception):
    """The recorded writes vary in a way the template cannot reproduce."""


class StartTemplate:
    def __init__(
        self, commands: list[list], options: list[dict], slots: list[tuple[int, int, str, object]], worker_name: str
    ):
        self.commands = commands
        self.options = options  # redis-py's per-command options (response handling), as recorded
        # (command index, argument index, kind, data): JOB/EXECUTION -> the text with placeholders,
        # INT_NOW -> the offset in seconds; FLOAT_NOW/ISO_NOW -> None.
        self.slots = slots
        self.worker_name = worker_name

    @classmethod
    def build(cls, record, worker_name: str) -> StartTemplate | None:
        """From ``record(job_id) -> (command stack, execution id)``, RQ's own start writes recorded in a
        pipeline (``pipe.command_stack``: (args, options) pairs); None if they do not fit."""
        try:
            first = cls._from(record, worker_name)
            second = cls._from(record, worker_name)
        except TemplateMismatch:
            return None
        if (first.commands, first.options, first.slots) != (second.commands, second.options, second.slots):
            return None
        return first

    @classmethod
    def _from(cls, record, worker_name: str) -> StartTemplate:
        job_id = f"pf-start-template-{uuid.uuid4().hex}"
        for _ in range(RECORD_TRIES):
            lo = time.time()
            stack, execution_id = record(job_id)
            hi = time.time()
            if int(lo) == int(hi):
                break
        else:
            raise TemplateMismatch("every recording straddled a second boundary")
        template: list[list] = []
        slots: list[tuple[int, int, str, object]] = []
        for c, (command, _options) in enumerate(stack):
            args = list(command)
            for a, arg in enumerate(args):
                slot = cls._slot(arg, job_id, execution_id, lo, hi)
                if slot is not None:
                    kind, data = slot
                    slots.append((c, a, kind, data))
                    args[a] = None
            template.append(args)
        return cls(template, [options for _command, options in stack], slots, worker_name)

    @staticmethod
    def _slot(arg, job_id: str, execution_id: str, lo: float, hi: float):
        if isinstance(arg, bool) or not isinstance(arg, str | int | float):
            return None
        if isinstance(arg, float) and arg >= EPOCH_SECONDS:
            if not lo - 0.001 <= arg <= hi + 0.001:
                raise TemplateMismatch(f"a time {arg} outside its recording")
            return FLOAT_NOW, None
        if isinstance(arg, int) and arg >= EPOCH_SECONDS:
            return INT_NOW, arg - int(lo)
        if not isinstance(arg, str):
            return None
        if _RQ_LAYOUT.fullmatch(arg):
            if not lo - 0.001 <= utcparse(arg).timestamp() <= hi + 0.001:
                raise TemplateMismatch(f"a time {arg} outside its recording")
            return ISO_NOW, None
        if job_id in arg or execution_id in arg:
            return JOB, arg.replace(job_id, "\0job\0").replace(execution_id, "\0execution\0")
        return None

    def render(self, job_id: str, connection) -> Rendered:
        execution_id = uuid.uuid4().hex
        stamp = time.time()
        at = datetime.datetime.fromtimestamp(stamp, datetime.UTC)
        iso, whole = utcformat(at), int(stamp)
        stamp = at.timestamp()  # as RQ writes it: from a datetime, microseconds
        commands = [list(c) for c in self.commands]
        for c, a, kind, data in self.slots:
            if kind == JOB:
                value = data.replace("\0job\0", job_id).replace("\0execution\0", execution_id)
            elif kind == INT_NOW:
                value = whole + data
            elif kind == FLOAT_NOW:
                value = stamp
            else:
                value = iso
            commands[c][a] = value
        execution = Execution(id=execution_id, job_id=job_id, connection=connection, worker_name=self.worker_name)
        execution.created_at = execution.last_heartbeat = at
        return Rendered([tuple(c) for c in commands], execution, at)
