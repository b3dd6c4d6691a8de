"""The stable path of the project's RQ worker class: ``dispatch_app.rqworker.PipelineWorker``.

Earlier deployments named it (``--worker-class``, django-rq's ``WORKER_CLASS``), so it stays where it always was;
the worker itself lives in ``dispatch_app.rq.worker``, with the rest of what runs a job. The one way to run
it is ``manage.py runworkers``: the app's ``rqworker`` refuses the project's queues, whatever worker class it is given.
"""

from dispatch_app.rq.worker.worker import PipelineWorker

__all__ = ["PipelineWorker"]
