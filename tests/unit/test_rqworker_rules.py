"""PipelineWorker's small rules: which workers count as failing every job, which queues runworkers accepts."""

import pytest

from dispatch_app.domains import queue_names
from dispatch_app.rq.state.health import FAILING_STREAK, failing
from dispatch_app.rq.worker.launch import BadQueues, parse_queues


@pytest.mark.parametrize(
    ("recent", "expected"),
    [
        ("", False),
        ("s" * 20, False),
        ("f" * FAILING_STREAK, True),
        ("s" + "f" * (FAILING_STREAK - 1), False),
        ("s" * 10 + "f" * FAILING_STREAK, True),
        ("d", True),  # cannot read its jobs: one is enough
        ("dfd", True),
        ("ds", False),  # it read the next one: a foreign job, not a broken worker
        ("sdf", True),
    ],
)
def test_failing_every_job(recent, expected):
    assert failing(recent, failed=recent.count("f") + recent.count("d"), successful=recent.count("s")) is expected


def test_workers_of_other_classes_are_judged_by_their_counters():
    assert failing("", failed=FAILING_STREAK, successful=0)
    assert not failing("", failed=100, successful=1)


def test_queues_default_to_every_domain_queue_and_narrow_in_the_given_order():
    assert parse_queues(None) == queue_names()
    assert parse_queues("delivery, workflow,delivery") == ("delivery", "workflow")


@pytest.mark.parametrize(
    ("text", "message"), [("", "--queues is empty"), ("delivery,mail", r"unknown queue\(s\) mail")]
)
def test_bad_queues_name_what_is_wrong(text, message):
    with pytest.raises(BadQueues, match=message) as caught:
        parse_queues(text)
    assert "valid queues: " + ", ".join(queue_names()) in str(caught.value)


def test_a_lane_can_be_named_alone_and_an_unknown_lane_is_refused():
    assert parse_queues("delivery.recovery") == ("delivery.recovery",)
    with pytest.raises(BadQueues, match=r"unknown queue\(s\) delivery\.urgent.*delivery\.recovery"):
        parse_queues("delivery.urgent")
