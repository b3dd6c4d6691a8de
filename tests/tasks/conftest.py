"""The task tests' settings: the project's TASKS plus a retry-safe queue, and signal recorders."""

from __future__ import annotations

import pytest
from django.test import override_settings

from dispatch_app.tasks.compat import task_enqueued, task_finished, task_started
from tests.acceptance.faults.conftest import fault_tmp, shared_stack  # noqa: F401 - the fault suite's stack, reused

TASKS = {
    "default": {
        "BACKEND": "dispatch_app.tasks.OutboxBackend",
        "QUEUES": ["default", "safe"],
        "OPTIONS": {"QUEUES": {"safe": {"RETRY_SAFE": True, "MAX_ATTEMPTS": 4}}},
    }
}


@pytest.fixture
def safe_queue():
    """A second queue, retry-safe: its own domain ("safe") with its own recovery policy."""
    with override_settings(TASKS=TASKS):
        yield


@pytest.fixture
def signals():
    """Every task signal sent in this process, in order: (signal name, sender, status, result id)."""
    seen = []

    def recorder(name):
        def receive(sender, task_result, **kwargs):
            seen.append((name, sender, task_result.status, task_result.id))

        return receive

    receivers = {
        sig: recorder(name)
        for sig, name in ((task_enqueued, "enqueued"), (task_started, "started"), (task_finished, "finished"))
    }
    for sig, receiver in receivers.items():
        sig.connect(receiver)
    yield seen
    for sig, receiver in receivers.items():
        sig.disconnect(receiver)
