"""Which loops a rundispatcher process runs: dispatch, recovery, or both."""

import pytest
from django.core.management import CommandError, call_command

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.domains import domain_keys
from dispatch_app.runtime import assembly

pytestmark = pytest.mark.django_db


def _names(**options) -> list[str]:
    return assembly.build(dispatch_settings(), options).loop_names()


def test_by_default_a_process_runs_listener_dispatch_and_every_recovery_loop():
    names = _names()
    assert {"listener", "dispatch"} <= set(names)
    assert {f"recovery-{d}" for d in domain_keys()} <= set(names)


def test_a_recovery_only_process_runs_no_listener_and_no_dispatch_loop():
    names = _names(no_dispatch=True, domains=["delivery", "agent"])
    assert "dispatch" not in names and "listener" not in names
    assert {n for n in names if n.startswith("recovery-")} == {"recovery-delivery", "recovery-agent"}


def test_a_dispatch_only_process_runs_no_recovery_loop():
    names = _names(no_recovery=True)
    assert "dispatch" in names
    assert not [n for n in names if n.startswith("recovery-")]


def test_nothing_to_run_is_a_usage_error():
    with pytest.raises(CommandError, match="leaves nothing to run") as failure:
        call_command("rundispatcher", "--no-dispatch", "--no-recovery")
    assert failure.value.returncode == 2


def test_by_default_recovery_runs_in_a_child_process_supervised_by_this_one():
    names = _names(domains=["delivery"])
    assert names[names.index("recovery-process") + 1] == "recovery-delivery"  # the child's loop, reported here


def test_recovery_in_process_runs_the_recovery_loops_as_threads():
    names = _names(recovery_in_process=True, domains=["delivery"])
    assert "recovery-process" not in names and "recovery-delivery" in names
