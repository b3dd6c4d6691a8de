"""Paths a deployment or a job in Redis names stay where they were, whatever moves inside the package."""

from __future__ import annotations

from rq.utils import import_attribute

from dispatch_app.execution import execute
from dispatch_app.rq.worker.worker import PipelineWorker


def test_the_worker_class_is_found_by_its_stable_path():
    # --worker-class and django-rq's WORKER_CLASS name it this way.
    assert import_attribute("dispatch_app.rqworker.PipelineWorker") is PipelineWorker


def test_a_domains_entry_point_is_found_by_the_path_its_rq_jobs_carry():
    entry = import_attribute("dispatch_app.run.delivery")
    assert entry.__module__ == "dispatch_app.run" and entry.__name__ == "delivery"
    assert entry.__globals__["execute"] is execute
