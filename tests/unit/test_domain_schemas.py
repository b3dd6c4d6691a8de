"""Each registered domain's payload schema: the demo payloads pass, bad ones name the field."""

import pytest

from dispatch_app.domains import PayloadError, UnknownDomain, all_domains, domain_keys, get_domain
from tests.factories import PAYLOADS

pytestmark = pytest.mark.version_dependent


def test_the_five_domains_are_registered_with_their_queues():
    # ... and the django.tasks queue "default" (settings.TASKS), whose jobs run dispatch_app.tasks.run.
    assert set(domain_keys()) == {"workflow", "image_series", "delivery", "partial_edit", "agent", "default"}
    for domain in all_domains():
        if domain.key == "default":
            assert domain.task_path == "dispatch_app.tasks.run.entry.default"
            continue
        assert domain.queue == domain.key
        # The shipped worker entry point: the domain modules never import the worker.
        assert domain.task_path == f"dispatch_app.run.{domain.key}"


@pytest.mark.parametrize("key", sorted(PAYLOADS))
def test_the_demo_payload_of_each_domain_is_valid(key):
    assert get_domain(key).validate(dict(PAYLOADS[key])) == PAYLOADS[key]


def test_an_unknown_domain_names_the_valid_ones():
    with pytest.raises(UnknownDomain, match="unknown domain 'retired'.*delivery"):
        get_domain("retired")


@pytest.mark.parametrize(
    ("key", "change", "message"),
    [
        ("delivery", {"target": None}, r"delivery\.target: required field is missing"),
        ("delivery", {"asset": 7}, r"delivery\.asset: expected string, got int"),
        ("delivery", {"asset": "  "}, r"delivery\.asset: must not be empty"),
        ("delivery", {"colour": "red"}, r"delivery: unknown field\(s\) colour"),
        ("image_series", {"count": True}, r"image_series\.count: expected integer, got a boolean"),
        ("image_series", {"count": 9}, r"image_series\.count: must be <= 8"),
        ("image_series", {"size": 1.5}, r"image_series\.size: expected integer, got float"),
        ("partial_edit", {"region": [0, 0, 8]}, r"partial_edit\.region: expected 4 items, got 3"),
        ("partial_edit", {"region": [0, 0, 8, "x"]}, r"partial_edit\.region\[3\]: expected integer"),
        ("workflow", {"steps": []}, r"workflow\.steps: must not be empty"),
    ],
)
def test_a_bad_payload_names_the_field(key, change, message):
    payload = dict(PAYLOADS[key])
    for name, value in change.items():
        if value is None:
            payload.pop(name)
        else:
            payload[name] = value
    with pytest.raises(PayloadError, match=message):
        get_domain(key).validate(payload)


def test_a_payload_that_is_not_an_object_is_rejected():
    with pytest.raises(PayloadError, match="payload must be a JSON object, got list"):
        get_domain("delivery").validate(["asset", "target"])
