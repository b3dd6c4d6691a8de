"""Execution: what runs a job once a worker has it, whatever handed it over.

- ``start_protocol``: the job's start, one function and one contract, made ahead of the take or when it runs.
- ``attempt``: ``execute`` -- start, run the domain's ``work``, settle its outcome (finish, retry, in doubt).
- ``context``: ``WorkContext``, what ``work`` is given (the vendor-call ledger behind ``call_vendor``).
- ``ledger``: one attempt's walk through its vendor calls.

The RQ side (the worker, its take and admission, the entry points Redis names) is ``dispatch_app.rq``: the entry
points ``dispatch_app.run.<domain>`` and ``dispatch_app.tasks.run.<queue>`` (``django.tasks``) both call
``execute``.
"""

from dispatch_app.execution.attempt import ERROR_MAX_CHARS, execute, format_error
from dispatch_app.execution.context import WorkContext

__all__ = ["ERROR_MAX_CHARS", "WorkContext", "execute", "format_error"]
