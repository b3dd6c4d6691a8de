"""A dispatcher process for one variant: ``python -m bench.child '<json spec>'``.

It runs the Supervisor that ``rundispatcher`` builds (``runtime.assembly.build``)
or, for the compared designs, a variant of it:

- ``dispatch``: the shipped design (optionally without LISTEN, or with plain
  ``FOR UPDATE`` claims for the locked-head comparison), plus optionally the
  real ``dispatch_app.recovery`` loops (``real_recovery``) or modeled recovery
  loops that can block in the database (``recovery``), each on its own thread;
- ``tick``: one batch per wake (wait-for-tick, the seed's drain);
- ``serial``: recovery rounds, then a dispatch drain, then wait, in one loop.

Protocol on stdin/stdout: prints ``ready`` once started (and connected when
listening); reads ``go`` (start dispatching when ``wait_go``) and ``stop``; on
stop it joins its loops and prints ``stats <json>``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def _spec() -> dict:
    return json.loads(sys.argv[1])


class TickLoop:
    """The seed's drain: one batch per wake or tick, never continuing on a full batch."""

    name = "dispatch"

    def __init__(self, dispatch):
        self.dispatch = dispatch

    def wait(self) -> str:
        return self.dispatch.wait()

    def run_once(self, trigger: str):
        return self.dispatch.dispatch_batch(trigger)


class SerialLoop:
    """The serial design: due recovery rounds, then dispatch, then wait, all on one thread."""

    name = "serial"

    def __init__(self, dispatch, recoveries):
        self.dispatch = dispatch
        self.recoveries = recoveries

    def wait(self) -> str:
        return self.dispatch.wait()

    def run_once(self, trigger: str):
        for recovery in self.recoveries:
            if recovery.due():
                recovery.run_once("tick")
        return self.dispatch.run_once(trigger)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "productflow.settings")
    import django

    django.setup()
    from bench.recovery_model import ModeledRecovery
    from dispatch_app.config.settings import dispatch_settings
    from dispatch_app.dispatch.wake import CATCH_UP
    from dispatch_app.runtime import assembly
    from dispatch_app.runtime.runner import LoopRunner
    from dispatch_app.store import claim

    spec = _spec()
    if spec.get("nice"):
        # As rundispatcher's recovery child: a lower CPU priority before any thread exists.
        os.nice(spec["nice"])
    if spec.get("switch_interval"):
        # How long a thread that wants the GIL waits for a busy one (CPython default 5 ms).
        sys.setswitchinterval(spec["switch_interval"])
    real = spec.get("real_recovery")
    conf = dispatch_settings(
        BATCH_SIZE=spec.get("batch", 100),
        SEND_CONCURRENCY=spec.get("concurrency", 4),
        SEND_CHUNK_SIZE=spec.get("chunk", 50),
        POLL_INTERVAL=spec.get("poll", 1.0),
        **({"LEASE_SECONDS": spec["lease"]} if "lease" in spec else {}),
        RECOVERY=real["overrides"] if real else None,
        **spec.get("settings", {}),
    )
    locking = spec.get("locking")
    if locking:
        original = claim.claim_batch

        def claim_with(limit, lease, *, locking_=locking, **_):
            return original(limit, lease, locking=locking_)

        claim.claim_batch = claim_with

    kind = spec.get("kind", "dispatch")
    # real_recovery: dispatch_app.recovery's loops, as rundispatcher starts them.
    options = {"no_listen": not spec.get("listen", True), "no_recovery": not real}
    if real:
        options["domains"] = list(real["domains"])
        # Default: in a niced child process, as rundispatcher runs them; True: threads of this process.
        options["recovery_in_process"] = spec.get("recovery_in_process", False)
    # The recovery child as before (benchmark A/B): synchronous commits, rounds that do not yield to a backlog.
    options["recovery_sync_commit"] = spec.get("recovery_sync_commit", False)
    options["recovery_no_yield"] = spec.get("recovery_no_yield", False)
    if kind == "recovery-only":
        # The modeled recovery loops alone, as the recovery child of rundispatcher runs its loops.
        from dispatch_app.runtime.recovery_child import recovery_sessions
        from dispatch_app.runtime.supervisor import Supervisor

        recovery_sessions(async_commit=not spec.get("recovery_sync_commit", False))

        supervisor = Supervisor(conf, listen=False, dispatch=False)
    else:
        supervisor = assembly.build(conf, options)
    recoveries = [
        ModeledRecovery(
            domain,
            period=rec["period"],
            batch_size=rec.get("batch", 25),
            stale_seconds=rec.get("stale", 60.0),
            block_seconds=rec.get("block_domains", {}).get(domain, 0.0),
            stop=supervisor.stop,
        )
        for rec in ([spec["recovery"]] if spec.get("recovery") else [])
        for domain in rec["domains"]
    ]
    if kind == "recovery-only" and not spec.get("recovery_no_yield", False):
        # As the recovery child's loops: a round waits while the outbox has a backlog (runtime.yielding).
        from dispatch_app.runtime.yielding import YieldingWait

        for recovery in recoveries:
            waiter = YieldingWait(supervisor.stop, recovery.period)

            def wait(recovery=recovery, waiter=waiter) -> str:
                waiter(max(0.0, recovery._next - time.monotonic()))
                return "tick"

            recovery.wait = wait
    waits = {"connect_wait_s": 0.0, "claim_wait_s": 0.0, "drains": 0}

    class WaitObserver:
        """Sums the dispatch loop's connect/claim waits, then hands on to the ops observer."""

        def __init__(self, inner):
            self.inner = inner

        def drained(self, result) -> None:
            waits["connect_wait_s"] += getattr(result, "connect_seconds", 0.0)
            waits["claim_wait_s"] += getattr(result, "claim_seconds", 0.0)
            waits["drains"] += 1
            # How the drains were woken (notify, poll, tick, due, ...) and how many envelopes they claimed.
            key = f"drains.{getattr(result, 'trigger', '?')}"
            waits[key] = waits.get(key, 0) + 1
            waits["claimed"] = waits.get("claimed", 0) + getattr(result, "claimed", 0)
            # Sends per attempt (issue 27): envelopes Redis answered for, against envelopes marked dispatched.
            for name in ("sends", "duplicates", "dispatched", "sent_ahead"):
                waits[name] = waits.get(name, 0) + getattr(result, name, 0)
            if self.inner is not None:
                self.inner.drained(result)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    if supervisor.dispatch is not None:
        supervisor.dispatch.observer = WaitObserver(supervisor.dispatch.observer)
    dispatch_runner = next((r for r in supervisor.runners if getattr(r, "name", "") == "dispatch"), None)
    if kind == "tick":
        dispatch_runner.loop = TickLoop(supervisor.dispatch)
    elif kind == "serial":
        dispatch_runner.loop = SerialLoop(supervisor.dispatch, recoveries)
    if kind != "serial":
        for recovery in recoveries:
            supervisor.runners.append(LoopRunner(recovery, supervisor.stop, domain=recovery.domain))

    commands: list[str] = []
    got = threading.Event()

    def read_stdin():
        for line in sys.stdin:
            if line.strip() == "report":  # the counters so far, while running (Child.counts)
                sys.stdout.write("counts " + json.dumps(dict(waits)) + "\n")
                sys.stdout.flush()
                continue
            commands.append(line.strip())
            got.set()
        commands.append("stop")
        got.set()

    threading.Thread(target=read_stdin, daemon=True).start()

    def wait_for(word: str) -> None:
        while word not in commands and "stop" not in commands:
            got.wait(0.5)
            got.clear()

    def say_ready() -> None:
        # One write: with PYTHONUNBUFFERED (CI) print() writes "ready" and its newline apart, and the recovery
        # child, which shares this stdout, once wrote its start-up line in between ("readyrecovery process...").
        sys.stdout.write("ready\n")
        sys.stdout.flush()

    def recovery_child_ready() -> None:
        # The default deployment's recovery child takes a Django start-up; measure once its loops run.
        for runner in supervisor.runners:
            ready = getattr(getattr(runner, "loop", None), "ready", None)
            if ready is not None:
                ready.wait(60)

    from dispatch_app.runtime.gcfreeze import freeze_startup

    freeze_startup("dispatch")  # as rundispatcher does before its loops start
    if spec.get("wait_go"):
        say_ready()
        wait_for("go")
        supervisor.start()
    else:
        supervisor.start()
        if supervisor.listener is not None:
            supervisor.listener.connected.wait(10)
        recovery_child_ready()
        say_ready()
    if supervisor.listener is None:
        supervisor.wake.set(CATCH_UP)
    wait_for("stop")
    started = time.monotonic()
    supervisor.request_stop()
    hung = supervisor.join(10)
    # CPU seconds of this process and of its waited-for children (the recovery child of the default deployment).
    cpu = os.times()
    stats = {
        "cpu_self_s": cpu.user + cpu.system,
        "cpu_children_s": cpu.children_user + cpu.children_system,
        "hung": hung,
        "stop_seconds": time.monotonic() - started,
        "scans": supervisor.dispatch.scans if supervisor.dispatch is not None else 0,
        "recovery": {r.domain: r.stats.as_dict() for r in recoveries},
        # Conditional NOTIFY (dispatch_app.dispatch.arming): how often this dispatcher armed and disarmed.
        **{
            f"notify_{name}": getattr(getattr(supervisor.wake, "arming", None), name, None)
            for name in ("arms", "disarms", "handovers")
        },
        **waits,
    }
    print("stats " + json.dumps(stats), flush=True)
    supervisor.close()


if __name__ == "__main__":
    main()
