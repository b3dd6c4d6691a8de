"""argparse ``type=`` validators shared by the commands: a bad value is exit code 2 with a clear message."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def int_between(low: int, high: int, what: str):
    """A validator of a whole number from ``low`` to ``high``; ``what`` names it in the errors ("a port number")."""
    span = f"{what} {low}-{high}"

    def validate(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {span}, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {span}, got {value}")
        return value

    validate.__name__ = what
    return validate


niceness = int_between(1, 19, "a niceness")
port_number = int_between(1, 65535, "a port number")


def domain_list(text: str) -> list[str]:
    from dispatch_app.domains import domain_keys

    chosen = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in chosen if d not in domain_keys()]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown domain(s) {', '.join(unknown) or repr(text)}; valid domains: {', '.join(domain_keys())}"
        )
    return chosen


class SettingsErrorExit2:
    """Mixin for a command: a bad DISPATCH setting is exit code 2 with its message, like a bad argument.

    Such a command sets ``requires_system_checks = []`` and validates the settings
    in ``handle()``, so Django's system check does not turn the error into exit 1.
    """

    requires_system_checks: list = []

    def execute(self, *args, **options):
        from django.core.exceptions import ImproperlyConfigured
        from django.core.management.base import CommandError

        try:
            return super().execute(*args, **options)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc), returncode=2) from None
