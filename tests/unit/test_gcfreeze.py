"""freeze_startup: what is alive is frozen out of full collections; what is already garbage is not."""

import gc
import logging
import weakref

import pytest

from dispatch_app.runtime.gcfreeze import freeze_startup

pytestmark = pytest.mark.version_dependent


class Node:
    pass


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process goes on collecting as before


def test_live_objects_are_frozen_and_garbage_is_collected_first(unfrozen, caplog):
    alive = Node()
    garbage = Node()
    garbage.self = garbage  # a cycle: only the cyclic collector frees it
    gone = weakref.ref(garbage)
    del garbage

    with caplog.at_level(logging.INFO, logger="dispatch_app.runtime"):
        frozen = freeze_startup("worker")

    assert gone() is None, "garbage from start-up was frozen instead of collected"
    assert frozen > 0 and gc.get_freeze_count() > 0
    assert not any(alive is obj for obj in gc.get_objects(generation=2)), "a live object stayed in full collections"
    record = next(r for r in caplog.records if getattr(r, "action", "") == "gc_frozen")
    assert record.domain == "worker" and str(frozen) in record.getMessage()
