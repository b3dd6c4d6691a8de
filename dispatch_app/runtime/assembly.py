"""Builds a Supervisor from the command's options: which loops this process runs."""

from __future__ import annotations

from dispatch_app.conf import DispatchSettings
from dispatch_app.domains import DOMAIN_KEYS
from dispatch_app.runtime.supervisor import Supervisor


def parse_domains(text: str | None) -> list[str]:
    if not text:
        return list(DOMAIN_KEYS)
    chosen = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in chosen if d not in DOMAIN_KEYS]
    if unknown:
        raise ValueError(f"unknown domain(s) {', '.join(unknown)}; valid domains: {', '.join(DOMAIN_KEYS)}")
    return chosen


def build(conf: DispatchSettings, options: dict) -> Supervisor:
    domains = parse_domains(options.get("domains"))
    supervisor = Supervisor(conf, listen=not options.get("no_listen"))
    if not options.get("no_recovery"):
        add_recovery_loops(supervisor, conf, domains)
    return supervisor


def add_recovery_loops(supervisor: Supervisor, conf: DispatchSettings, domains: list[str]) -> None:
    """Seam for dispatch_app.recovery: one loop per domain, each on its own thread."""
