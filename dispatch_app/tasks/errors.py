"""Exceptions a task's TaskError names when the job ended without the task raising one itself.

``TaskError.exception_class`` imports the class path, so each outcome has a real class here.
"""


class TaskOutcomeUnknown(Exception):  # noqa: N818 - an outcome, named as TaskError shows it
    """The run was interrupted (worker died, call in doubt) and the task is not retry-safe:
    whether it took effect is unknown, so it is not run again (job status ``outcome_unknown``)."""


class TaskCancelled(Exception):  # noqa: N818
    """An operator cancelled the job before it finished (job status ``cancelled``)."""


class TaskNotRun(Exception):  # noqa: N818
    """The job failed outside the task's code (payload rejected, attempts exhausted); Job.error says why."""


class ErrorNotRetried(Exception):  # noqa: N818
    """A task on a queue that is not retry-safe raised an error the worker retries (a lost database
    session, a ProviderError).

    Wrapped so the worker fails the job instead of re-running it through the outbox (what it does for
    a domain whose work resumes from its vendor-call ledger): a second run could repeat its effects.
    The original exception is chained in the traceback.
    """
