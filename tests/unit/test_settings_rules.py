"""Rules between DISPATCH settings (dispatch_app.config.rules): each bad pair is named at start-up."""

import pytest
from django.core import checks
from django.test import override_settings

from dispatch_app.config.rules import TAG, check_settings_rules


def messages(**dispatch):
    with override_settings(DISPATCH=dispatch):
        return check_settings_rules()


def test_the_defaults_break_no_rule():
    assert messages() == []


def test_the_rules_run_with_djangos_checks_under_their_tag():
    assert TAG in checks.registry.registry.tags_available()
    with override_settings(DISPATCH={"RETENTION_INTERVAL": 500.0}):
        found = checks.run_checks(tags=[TAG])
    assert [m.id for m in found] == ["productflow.E101"]


@pytest.mark.parametrize(
    ("dispatch", "check_id", "level", "named"),
    [
        ({"RETENTION_INTERVAL": 120.0}, "productflow.E101", checks.ERROR, ["RETENTION_INTERVAL", "120", "= 120"]),
        ({"HEARTBEAT_INTERVAL": 61.0}, "productflow.E102", checks.ERROR, ["HEARTBEAT_INTERVAL", "61"]),
        ({"POLL_INTERVAL": 200.0, "NOTIFY_ARM_LEASE": 600.0, "OUTBOX_AGE_ALARM_SECONDS": 900.0}, "productflow.E103",
         checks.ERROR, ["POLL_INTERVAL", "200"]),
        ({"RECOVERY": {"delivery": {"PERIOD_SECONDS": 118.0, "JITTER_SECONDS": 5.0}}}, "productflow.E104",
         checks.ERROR, ["['delivery']['PERIOD_SECONDS'] = 118"]),
        ({"RETENTION_HEARTBEATS": 100.0}, "productflow.E105", checks.ERROR, ["RETENTION_HEARTBEATS", "100"]),
        ({"LEASE_SECONDS": 4.0, "SHUTDOWN_DEADLINE": 3.0}, "productflow.E106", checks.ERROR,
         ["LEASE_SECONDS", "REDIS_SOCKET_TIMEOUT"]),
        ({"POLL_INTERVAL": 5.0, "NOTIFY_ARM_LEASE": 10.0, "OUTBOX_AGE_ALARM_SECONDS": 60.0}, "productflow.W101",
         checks.WARNING, ["NOTIFY_ARM_LEASE", "= 10", "POLL_INTERVAL", "= 5"]),
        ({"LISTEN_TIMEOUT": 15.0}, "productflow.W102", checks.WARNING, ["LISTEN_TIMEOUT", "LISTEN_DEAD_AFTER", "15"]),
        ({"SHUTDOWN_DEADLINE": 30.0}, "productflow.W103", checks.WARNING, ["SHUTDOWN_DEADLINE", "LEASE_SECONDS", "30"]),
        ({"OUTBOX_AGE_ALARM_SECONDS": 1.0}, "productflow.W104", checks.WARNING, ["OUTBOX_AGE_ALARM_SECONDS", "= 1"]),
    ],
)  # fmt: skip
def test_each_bad_pair_is_reported_naming_both_settings(dispatch, check_id, level, named):
    found = messages(**dispatch)
    assert [m.id for m in found] == [check_id], [str(m) for m in found]
    message = found[0]
    assert message.level == level
    assert message.hint
    for text in named:
        assert text in message.msg
    # Both settings of the pair are named with their values.
    assert message.msg.count("DISPATCH[") >= 2


@override_settings(REDIS_SOCKET_TIMEOUT=None)
def test_the_lease_rule_needs_the_socket_timeout():
    assert messages(LEASE_SECONDS=4.0, SHUTDOWN_DEADLINE=3.0) == []


def test_a_key_bad_on_its_own_is_left_to_the_settings_check():
    assert messages(RETENTION_INTERVAL=-1) == []
