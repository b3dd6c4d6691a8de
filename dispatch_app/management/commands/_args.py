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


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 1-65535, got {value}")
    return value


def domain_list(text: str) -> list[str]:
    from dispatch_app.domains import DOMAIN_KEYS

    chosen = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in chosen if d not in DOMAIN_KEYS]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown domain(s) {', '.join(unknown) or repr(text)}; valid domains: {', '.join(DOMAIN_KEYS)}"
        )
    return chosen
