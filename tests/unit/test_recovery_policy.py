"""Per-domain recovery policy and the validation of DISPATCH['RECOVERY']."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ImproperlyConfigured

from dispatch_app.config.settings import dispatch_settings, validate
from dispatch_app.domains import domain_keys, get_domain
from dispatch_app.domains.policy import KEYS, resolve, resolve_all


def test_every_domain_has_a_policy_with_the_documented_defaults():
    policies = resolve_all()
    assert set(policies) == set(domain_keys())
    for key, policy in policies.items():
        base = get_domain(key).recovery
        assert policy.domain == key
        assert policy.batch_size == base.batch_size == 25
        assert policy.redispatch_cap == 25
        assert policy.max_attempts == base.max_attempts
    assert policies["delivery"].retry_safe and policies["workflow"].retry_safe
    assert not policies["agent"].retry_safe and not policies["agent"].uses_vendor_request_id
    assert policies["image_series"].uses_vendor_request_id and not policies["image_series"].retry_safe


def test_overrides_apply_to_their_domain_only():
    overrides = {"delivery": {"BATCH_SIZE": 50, "RUNNING_STALE_SECONDS": 0, "RETRY_SAFE": False}}
    assert resolve("delivery", overrides).batch_size == 50
    assert resolve("delivery", overrides).running_stale_seconds == 0.0
    assert resolve("delivery", overrides).retry_safe is False
    assert resolve("workflow", overrides).batch_size == 25


def test_the_batch_size_bounds_the_rate_cap():
    assert resolve("delivery", {"delivery": {"MAX_REDISPATCHES_PER_ROUND": 5}}).redispatch_cap == 5
    assert resolve("delivery", {"delivery": {"MAX_REDISPATCHES_PER_ROUND": 500}}).redispatch_cap == 25
    assert resolve("delivery", {"delivery": {"MAX_REDISPATCHES_PER_ROUND": 0}}).redispatch_cap == 0


def test_stale_seconds_by_status():
    policy = resolve("agent", {"agent": {"QUEUED_STALE_SECONDS": 1, "RUNNING_STALE_SECONDS": 2}})
    assert [policy.stale_seconds(s) for s in ("submitted", "queued", "running")] == [1, 1, 2]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "DISPATCH['RECOVERY'] must be a dict"),
        ({"delivry": {}}, "DISPATCH['RECOVERY']['delivry'] is not a domain; did you mean 'delivery'?"),
        ({"nope": {}}, "valid domains: workflow, image_series, delivery, partial_edit, agent"),
        ({"agent": 5}, "DISPATCH['RECOVERY']['agent'] must be a dict"),
        (
            {"agent": {"BATCH": 5}},
            "['agent']['BATCH'] is not a setting; did you mean 'BATCH_SIZE'?",
        ),
        ({"agent": {"BATCH_SIZE": 0}}, "DISPATCH['RECOVERY']['agent']['BATCH_SIZE'] must be >= 1, got 0"),
        ({"agent": {"BATCH_SIZE": 2.5}}, "['BATCH_SIZE'] must be a whole number"),
        ({"agent": {"MAX_ATTEMPTS": True}}, "['MAX_ATTEMPTS'] must be a number, got True"),
        ({"agent": {"PERIOD_SECONDS": "30"}}, "['PERIOD_SECONDS'] must be a number, got '30'"),
        ({"agent": {"PERIOD_SECONDS": 0}}, "['PERIOD_SECONDS'] must be >= 0.01"),
        ({"agent": {"QUEUED_STALE_SECONDS": -1}}, "['QUEUED_STALE_SECONDS'] must be >= 0"),
        ({"agent": {"JITTER_SECONDS": float("nan")}}, "['JITTER_SECONDS'] must be a number"),
        ({"agent": {"RETRY_SAFE": "yes"}}, "['RETRY_SAFE'] must be True or False"),
        ({"agent": {"MAX_REDISPATCHES_PER_ROUND": -1}}, "['MAX_REDISPATCHES_PER_ROUND'] must be >= 0"),
    ],
)
def test_bad_overrides_are_clear_startup_errors(raw, message):
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        validate({"RECOVERY": raw})


def test_settings_are_validated_through_dispatch_settings(settings):
    settings.DISPATCH = {"RECOVERY": {"delivery": {"BATCH_SIZE": 7, "MAX_REDISPATCHES_PER_ROUND": None}}}
    conf = dispatch_settings()
    assert conf.RECOVERY == {"delivery": {"BATCH_SIZE": 7, "MAX_REDISPATCHES_PER_ROUND": None}}
    assert resolve("delivery", conf.RECOVERY).batch_size == 7
    settings.DISPATCH = {"RECOVERY": {"delivery": {"BATCH_SIZE": 0}}}
    with pytest.raises(ImproperlyConfigured, match=r"\['delivery'\]\['BATCH_SIZE'\]"):
        dispatch_settings()


def test_every_key_maps_to_a_policy_field():
    policy = resolve("delivery")
    for spec in KEYS.values():
        assert hasattr(policy, spec.field)


@pytest.mark.parametrize(
    ("domain", "askable", "expected"),
    [
        ("workflow", False, "rerun"),  # retry-safe: the call is made again, asked or not
        ("delivery", True, "rerun"),
        ("image_series", True, "ask"),  # not retry-safe, a vendor that keeps request records
        ("image_series", False, "outcome_unknown"),  # ... but this call left nothing to ask about
        ("agent", True, "outcome_unknown"),  # not retry-safe, a vendor that cannot be asked
    ],
)
def test_one_place_decides_what_a_call_left_in_doubt_becomes(domain, askable, expected):
    assert resolve(domain).in_doubt(askable=askable) == expected


def test_a_settings_override_changes_what_a_call_in_doubt_becomes():
    assert resolve("agent", {"agent": {"RETRY_SAFE": True}}).in_doubt(askable=False) == "rerun"
    assert resolve("workflow", {"workflow": {"RETRY_SAFE": False}}).in_doubt(askable=False) == "outcome_unknown"
