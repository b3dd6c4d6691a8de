"""The RQ internals the project relies on (dispatch_app.rq.internals), checked against the installed RQ.

An RQ upgrade that renames, removes or re-signs one of them fails here by name, not in production.
"""

import inspect
import re

import pytest
import redis
from rq.job import Job
from rq.queue import Queue
from rq.scripts import UNIQUE_ENQUEUE_SCRIPT
from rq.utils import utcformat, utcparse
from rq.worker import SimpleWorker

from dispatch_app.rq import internals as rq_internals
from dispatch_app.rq.internals import INTERNALS, Internal, RQContractError
from dispatch_app.rq.worker import PipelineWorker, fast_paths

pytestmark = pytest.mark.version_dependent


@pytest.mark.parametrize("item", INTERNALS, ids=lambda item: item.path)
def test_each_internal_is_as_we_rely_on_it(item):
    found = rq_internals.problem(item)
    assert found is None, found


@pytest.mark.parametrize(
    ("item", "says"),
    [
        (Internal("rq.worker.base:BaseWorker._gone_method", "method", "x"), "is missing"),
        (Internal("rq.no_such_module:name", "global", "x"), "is missing"),
        (Internal("rq.job:Job._gone_attribute", "attribute", "x"), "no longer set by RQ's code"),
        (Internal("rq.queue:Queue._prepare_for_queue", "method", "x", ("self", "job", "pipeline")), "takes"),
        (Internal("rq.job:Job.redis_job_namespace_prefix", "value", "x", expected="rq:jobs:"), "we assume"),
        (Internal("rq.job:Job.redis_job_namespace_prefix", "method", "x"), "no longer callable"),
        (Internal(f"{rq_internals._BASE}.request_force_stop", "method", "x", called_by_rq=True), "no longer called"),
    ],
)
def test_the_check_names_what_changed(item, says):
    """The checker can fail: a deliberately wrong entry is reported by name, with where to look."""
    found = rq_internals.problem(item)
    assert found is not None
    assert found.startswith(f"RQ changed: {item.path}")
    assert says in found
    assert found.endswith("see dispatch_app/rq/internals.py")


def test_verify_raises_naming_every_missing_one(monkeypatch):
    missing = Internal("rq.worker.base:BaseWorker._finalize_everything", "method", "x")
    monkeypatch.setattr(rq_internals, "INTERNALS", (*INTERNALS, missing))
    with pytest.raises(RQContractError, match=r"RQ changed: rq\.worker\.base:BaseWorker\._finalize_everything"):
        rq_internals.verify.__wrapped__()  # verify() itself runs once per process (cached)


def test_verify_passes_on_the_installed_rq():
    rq_internals.verify.__wrapped__()


def test_every_private_method_the_worker_overrides_or_calls_is_listed():
    """A new override of an RQ private method (or a new ``super()._x`` call) must be listed too."""
    listed = {item.name for item in INTERNALS if item.path.startswith("rq.worker.base:")}
    ours = set()
    for klass in PipelineWorker.__mro__:
        if klass.__module__.startswith("dispatch_app."):
            ours |= {n for n in vars(klass) if n.startswith("_") and not n.startswith("__")}
    rq_private = {n for n in dir(SimpleWorker) if n.startswith("_") and not n.startswith("__")}
    assert ours & rq_private <= listed, f"RQ private methods overridden but not listed: {(ours & rq_private) - listed}"
    source = "".join(inspect.getsource(k) for k in PipelineWorker.__mro__ if k.__module__.startswith("dispatch_app."))
    called = set(re.findall(r"self\.(_[a-z]\w*)", source)) & rq_private
    assert called <= listed, f"RQ private names used by the worker but not listed: {called - listed}"


def test_the_enqueue_script_keeps_its_keys_and_arguments():
    for line in rq_internals.UNIQUE_ENQUEUE_LINES:
        assert line in UNIQUE_ENQUEUE_SCRIPT, f"RQ changed: UNIQUE_ENQUEUE_SCRIPT no longer says {line!r}"
    assert 'redis.call("HSET", KEYS[1], unpack(ARGV, 4))' in UNIQUE_ENQUEUE_SCRIPT


def test_key_formats():
    never_connected = redis.Redis(port=1)  # building these objects sends nothing
    assert Queue("delivery", connection=never_connected).key == rq_internals.queue_key("delivery")
    assert Job("pf-1-1", connection=never_connected).key == rq_internals.job_key("pf-1-1")
    assert rq_internals.intermediate_key("rq:queue:delivery") == "rq:queue:delivery:intermediate"
    assert rq_internals.workers_of_queue_key("delivery") == "rq:workers:delivery"


def test_utcformat_is_the_layout_fast_paths_reads():
    import datetime

    at = datetime.datetime(2026, 12, 2, 5, 7, 40, 413979, tzinfo=datetime.UTC)
    text = utcformat(at)
    assert fast_paths._RQ_LAYOUT.fullmatch(text), f"RQ changed: utcformat writes {text!r}"
    assert fast_paths.utcparse(text) == utcparse(text) == at


def test_fast_paths_take_their_module_lists_from_here():
    assert fast_paths.SERIALIZER_MODULES is rq_internals.SERIALIZER_MODULES
    assert fast_paths.UTCPARSE_MODULES is rq_internals.UTCPARSE_MODULES
