"""The stable path of the project's RQ worker class: ``dispatch_app.rqworker.PipelineWorker``.

A deployment names it (``--worker-class``, django-rq's ``WORKER_CLASS``), so it stays where it always was; the
worker itself lives in ``dispatch_app.worker.rqworker``, with the rest of what runs a job.
"""

from dispatch_app.worker.rqworker.worker import PipelineWorker

__all__ = ["PipelineWorker"]
