"""Builds a Supervisor from the command's options: which loops this process runs."""

from __future__ import annotations

from dispatch_app.conf import DispatchSettings
from dispatch_app.domains import DOMAIN_KEYS
from dispatch_app.ops.wiring import Ops
from dispatch_app.runtime.supervisor import Supervisor


def build(conf: DispatchSettings, options: dict) -> Supervisor:
    if options.get("no_dispatch") and options.get("no_recovery"):
        raise ValueError("--no-dispatch with --no-recovery leaves nothing to run")
    domains = options.get("domains") or list(DOMAIN_KEYS)
    # Operations (dispatch_app.ops): metrics observer, heartbeat, retention, --metrics-port.
    ops = Ops(conf, options)
    supervisor = Supervisor(
        conf, listen=not options.get("no_listen"), dispatch=not options.get("no_dispatch"), observer=ops.observer
    )
    if not options.get("no_recovery"):
        add_recovery_loops(supervisor, conf, domains)
    ops.attach(supervisor)
    return supervisor


def add_recovery_loops(supervisor: Supervisor, conf: DispatchSettings, domains: list[str]) -> None:
    """Seam for dispatch_app.recovery: one loop per domain, each on its own thread."""
    from dispatch_app.recovery.loop import RecoveryLoop
    from dispatch_app.recovery.policy import resolve

    # Resolved before any thread starts: a bad override fails the start, not a loop.
    policies = [resolve(domain, conf.RECOVERY) for domain in domains]
    for policy in policies:
        supervisor.add_loop(RecoveryLoop(policy, supervisor.stop), domain=policy.domain)
