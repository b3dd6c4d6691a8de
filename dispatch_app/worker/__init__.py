"""The worker: everything that runs a job, in one package.

- ``start_protocol``: the job's start, one function and one contract, made ahead of the take or when it runs.
- ``execution``: ``execute`` -- start, run the domain's ``work``, settle its outcome (finish, retry, in doubt).
- ``context``: ``WorkContext``, what ``work`` is given (the vendor-call ledger behind ``call_vendor``).
- ``rqworker``: the project's RQ worker (``PipelineWorker``): the take, admission, the start written with the
  take, liveness, health, the lanes' share, and every RQ internal it relies on through ``rq_internals``.

The entry points stay where Redis names them, since a job in a queue carries the path: ``dispatch_app.run.<domain>``
and ``dispatch_app.tasks.run.<queue>`` (``django.tasks``); both call ``execute``.
"""

from dispatch_app.worker.context import WorkContext
from dispatch_app.worker.execution import ERROR_MAX_CHARS, execute, format_error

__all__ = ["ERROR_MAX_CHARS", "WorkContext", "execute", "format_error"]
