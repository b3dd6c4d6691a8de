"""The project's RQ workers: ``PipelineWorker`` and how ``manage.py runworkers`` runs them.

RQ stays the engine (queues, job hashes, registries); this package owns how the
project's workers run. Import the class by its stable path:
``dispatch_app.rqworker.PipelineWorker`` (an alias kept for deployments that name it).
"""

from dispatch_app.rq.worker.worker import PipelineWorker

__all__ = ["PipelineWorker"]
