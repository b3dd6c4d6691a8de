"""The RQ worker running the current job, asked of RQ (its ``get_current_job``) by code that is not the worker."""

from __future__ import annotations

from rq import get_current_job

# The attribute of the job being performed that carries the start its worker made ahead of the take
# (``execution.start_protocol.Held``): the worker sets it, ``execute`` takes it (``take_start``).
START_ATTRIBUTE = "pf_start"


def worker_name() -> str:
    """The RQ worker running this job ('' outside one, e.g. a test calling ``execute``)."""
    job = get_current_job()
    return (getattr(job, "worker_name", None) or "") if job is not None else ""


def take_start(job_id: int, attempt: int):
    """The start the worker handed over with the job it is performing, if it is this (job, attempt)'s; taken once."""
    job = get_current_job()
    held = getattr(job, START_ATTRIBUTE, None) if job is not None else None
    if held is None or held.job_id != job_id or held.attempt != attempt:
        return None
    setattr(job, START_ATTRIBUTE, None)
    return held
