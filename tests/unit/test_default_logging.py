"""runtime.default_logging: our records reach stderr, with their action, only where nothing else would take them."""

from __future__ import annotations

import logging
import logging.config

import pytest

from dispatch_app.runtime.default_logging import LOGGER, ensure_logging


@pytest.fixture
def unconfigured(monkeypatch):
    """As in a project made with startproject: no handler on the root or on our logger, levels unset.

    Called inside the test: pytest adds its capture handlers to the root after the fixtures ran.
    """

    def clear() -> logging.Logger:
        ours = logging.getLogger(LOGGER)
        monkeypatch.setattr(logging.root, "handlers", [])
        monkeypatch.setattr(ours, "handlers", [])
        monkeypatch.setattr(ours, "level", logging.NOTSET)
        monkeypatch.setattr(logging.root, "level", logging.WARNING)
        return ours

    return clear


def test_with_nothing_configured_info_lines_reach_stderr_with_their_action(unconfigured, capsys):
    ours = unconfigured()
    logging.getLogger("dispatch_app.dispatch").info("nothing runs yet")  # before: the last resort drops INFO
    assert capsys.readouterr().err == ""
    handler = ensure_logging()
    assert handler is not None
    try:
        logging.getLogger("dispatch_app.dispatch").info(
            "dispatch paused", extra={"action": "dispatch_paused", "domain": "delivery"}
        )
        logging.getLogger("dispatch_app.recovery").warning("no action named")
        err = capsys.readouterr().err.splitlines()
        assert err[0].endswith("INFO dispatch_app.dispatch dispatch paused action=dispatch_paused domain=delivery")
        assert err[1].endswith("WARNING dispatch_app.recovery no action named")
        assert ensure_logging() is None, "a second call adds no second handler"
    finally:
        ours.removeHandler(handler)


def test_a_traceback_follows_the_action(unconfigured, capsys):
    ours = unconfigured()
    handler = ensure_logging()
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("dispatch_app.execution").exception("failed", extra={"action": "x_failed", "domain": "d"})
        err = capsys.readouterr().err.splitlines()
        assert err[0].endswith("failed action=x_failed domain=d")
        assert err[-1] == "ValueError: boom"
    finally:
        ours.removeHandler(handler)


def test_configured_logging_is_left_alone(unconfigured):
    ours = unconfigured()
    root_handler = logging.StreamHandler()
    logging.root.addHandler(root_handler)
    assert ensure_logging() is None
    assert ours.handlers == [] and ours.level == logging.NOTSET


def test_this_repositorys_settings_print_the_action_and_domain():
    from django.conf import settings

    formatter = logging.config.DictConfigurator(settings.LOGGING).configure_formatter(
        settings.LOGGING["formatters"]["plain"]
    )
    record = logging.makeLogRecord({"name": "dispatch_app.recovery", "levelname": "ERROR", "msg": "round failed"})
    record.action, record.domain = "recovery_round_failed", "delivery"
    assert formatter.format(record).endswith(
        "ERROR dispatch_app.recovery round failed action=recovery_round_failed domain=delivery"
    )
