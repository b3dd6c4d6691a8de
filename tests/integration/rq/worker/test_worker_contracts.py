"""Each mixin of PipelineWorker names what it needs of the worker (``rq.worker.contracts``): a real worker has it."""

from __future__ import annotations

import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app.rq.worker import PipelineWorker, contracts

MIXINS = [klass for klass in PipelineWorker.__mro__ if "NEEDS" in vars(klass)]


def test_every_mixin_of_the_worker_names_its_contract():
    names = {klass.__name__ for klass in MIXINS}
    assert {"StartsMixin", "WritesMixin", "EvidenceMixin", "OutageMixin"} <= names


@pytest.mark.parametrize("mixin", MIXINS, ids=lambda k: k.__name__)
def test_a_real_worker_has_what_each_mixin_needs(redis_conn, mixin):
    worker = PipelineWorker(
        [Queue("delivery", connection=redis_conn, serializer=JSONSerializer)], connection=redis_conn
    )
    assert contracts.missing(worker, mixin.NEEDS) == []


def test_a_worker_without_an_attribute_a_contract_names_is_found():
    class Half:
        _recent = None
        _pending_fields: dict = {}

        def _flush_pending(self): ...

    assert contracts.missing(Half(), contracts.EvidenceHost) == [
        "_told_undeserializable",
        "_undeserializable",
        "_write_fields",
        "heartbeat_interval",
    ]
    assert "_start_templates" in contracts.missing(Half(), contracts.WritesHost)  # a contract's bases count too
