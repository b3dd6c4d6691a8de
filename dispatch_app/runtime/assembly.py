"""Builds a Supervisor from the command's options: which loops this process runs."""

from __future__ import annotations

from dispatch_app.config.settings import DispatchSettings
from dispatch_app.config.tuning import DEFAULT_NICE
from dispatch_app.domains import domain_keys
from dispatch_app.housekeeping.wiring import Ops
from dispatch_app.runtime.supervisor import Supervisor


def build(conf: DispatchSettings, options: dict) -> Supervisor:
    if options.get("no_dispatch") and options.get("no_recovery"):
        raise ValueError("--no-dispatch with --no-recovery leaves nothing to run")
    domains = options.get("domains") or list(domain_keys())
    # Operations (dispatch_app.ops): metrics observer, heartbeat, retention, --metrics-port.
    ops = Ops(conf, options)
    supervisor = Supervisor(
        conf, listen=not options.get("no_listen"), dispatch=not options.get("no_dispatch"), observer=ops.observer
    )
    if not options.get("no_recovery"):
        # A recovery-only process (--no-dispatch) is already the recovery process: its loops run in it.
        if options.get("recovery_in_process") or options.get("no_dispatch"):
            add_recovery_loops(supervisor, conf, domains)
        else:
            add_recovery_process(
                supervisor,
                conf,
                domains,
                nice=options.get("recovery_nice"),
                async_commit=not options.get("recovery_sync_commit"),
                yield_to_new_work=not options.get("recovery_no_yield"),
            )
    ops.attach(supervisor)
    return supervisor


def add_recovery_process(
    supervisor: Supervisor,
    conf: DispatchSettings,
    domains: list[str],
    *,
    nice=None,
    async_commit: bool = True,
    yield_to_new_work: bool = True,
):
    """The default: the recovery loops in a supervised child process at a lower CPU priority."""
    from dispatch_app.domains.policy import resolve
    from dispatch_app.runtime.recovery_process import RecoveryProcessLoop, RecoveryProcessRunner

    # Resolved here too, so a bad override fails this command, not a child restarted forever.
    for domain in domains:
        resolve(domain, conf.RECOVERY)
    loop = RecoveryProcessLoop(
        conf,
        domains,
        supervisor.stop,
        observer=supervisor.observer,
        nice=DEFAULT_NICE if nice is None else nice,
        async_commit=async_commit,
        yield_to_new_work=yield_to_new_work,
    )
    runner = RecoveryProcessRunner(
        loop,
        supervisor.stop,
        max_backoff=conf.RECONNECT_BACKOFF_MAX,
        on_success=supervisor._on_success,
        on_error=supervisor._on_error,
    )
    supervisor.runners.append(runner)
    supervisor.closers.append(loop.kill)
    return runner


def add_recovery_loops(
    supervisor: Supervisor, conf: DispatchSettings, domains: list[str], *, yield_to_new_work: bool = False
) -> None:
    """Seam for dispatch_app.recovery: one loop per domain, each on its own thread.

    ``yield_to_new_work`` (the recovery child): a round waits while the outbox
    has a backlog, at most one period (runtime.yielding).
    """
    from dispatch_app.domains.policy import resolve
    from dispatch_app.recovery.loop import RecoveryLoop
    from dispatch_app.recovery.pacing import Pacer
    from dispatch_app.runtime.yielding import YieldingWait

    # Resolved before any thread starts: a bad override fails the start, not a loop.
    policies = [resolve(domain, conf.RECOVERY) for domain in domains]
    pacer = Pacer.from_settings(conf)  # one for the process: one look at new work serves every domain
    for policy in policies:
        waiter = YieldingWait(supervisor.stop, policy.period_seconds) if yield_to_new_work else None
        loop = RecoveryLoop(policy, supervisor.stop, waiter=waiter, pacer=pacer)
        supervisor.add_loop(loop, domain=policy.domain)
