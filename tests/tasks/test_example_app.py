"""The example app (examples/shop) works as the README says: its settings, its tasks and its own domain."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from django.db import transaction
from django.test import override_settings

from dispatch_app.models import Job
from dispatch_app.tasks.compat import TaskResultStatus
from tests.helpers import MANAGE, PYTHON, ROOT
from tests.integration.recovery_helpers import dispatch_now, run_workers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.version_dependent]


@pytest.fixture
def example_settings():
    from examples import settings as example

    with override_settings(TASKS=example.TASKS, PRODUCTFLOW_DOMAINS=example.PRODUCTFLOW_DOMAINS):
        # Imported under these settings: its tasks are validated against the example's TASKS when defined.
        yield importlib.import_module("examples.shop.orders")
    for name in ("examples.shop.orders", "examples.shop.tasks"):
        sys.modules.pop(name, None)


def test_an_order_enqueues_tasks_and_an_invoice_that_all_run(example_settings, redis_conn):
    from examples.shop.tasks import make_thumbnail, send_receipt

    ids = example_settings.place_order("o-1", "ana@example.invalid", 4200, "shoe.png")
    dispatch_now()
    run_workers(redis_conn)

    receipt = send_receipt.get_result(ids["receipt"])
    assert receipt.status == TaskResultStatus.SUCCESSFUL
    assert receipt.return_value == {"order_id": "o-1", "sent_to": "ana@example.invalid"}
    thumbnail = make_thumbnail.get_result(ids["thumbnail"])
    assert thumbnail.return_value == {"thumbnail": "shoe.png@256w", "attempt": 1}
    invoice = Job.objects.get(pk=ids["invoice"])
    assert (invoice.domain, invoice.status, invoice.result) == (
        "invoice",
        "succeeded",
        {
            "invoice": "INV-o-1",
            "total_cents": 4200,
        },
    )
    assert Job.objects.get(pk=int(ids["thumbnail"])).domain == "thumbnails"


def test_an_order_rolled_back_leaves_nothing_to_run(example_settings):
    with pytest.raises(RuntimeError), transaction.atomic():
        example_settings.place_order("o-2", "bo@example.invalid", 100, "hat.png")
        raise RuntimeError("payment declined")
    assert not Job.objects.exists()


def test_the_example_settings_pass_djangos_checks(subprocess_env):
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "examples.settings"}
    done = subprocess.run([PYTHON, MANAGE, "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
