"""``manage.py rundispatcher``: the listener, the dispatch loop and the recovery loops.

By default the recovery loops run in a supervised child process at a lower CPU
priority (``runtime.recovery_process``), so recovery does not take the
dispatcher's GIL and cores. Exit codes: 0 clean stop; 1 forced exit (second
signal) or a crash; 2 bad arguments or settings; 3 a loop (or the recovery
process) was still running at the shutdown deadline.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from django.core.management.base import BaseCommand, CommandError

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.db.session_bounds import bound_sessions
from dispatch_app.management.commands._args import (
    SettingsErrorExit2,
    domain_list,
    int_between,
    port_number,
    positive_float,
    positive_int,
)
from dispatch_app.management.commands._deployment import require_own_redis
from dispatch_app.management.commands._migrated import require_migrated
from dispatch_app.runtime.default_logging import ensure_logging

log = logging.getLogger("dispatch_app.rundispatcher")

EXIT_HUNG = 3


nice_increment = int_between(0, 19, "a nice increment")


class Command(SettingsErrorExit2, BaseCommand):
    help = "Run the dispatcher: LISTEN/NOTIFY wake-ups, the dispatch loop and per-domain recovery loops."

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=positive_int, help="envelopes per claim (DISPATCH BATCH_SIZE)")
        parser.add_argument("--concurrency", type=positive_int, help="sends in flight (DISPATCH SEND_CONCURRENCY)")
        parser.add_argument("--poll-interval", type=positive_float, help="fallback tick, seconds (POLL_INTERVAL)")
        parser.add_argument("--lease", type=positive_float, help="lease of a claim, seconds (LEASE_SECONDS)")
        parser.add_argument("--shutdown-deadline", type=positive_float, help="seconds to stop (SHUTDOWN_DEADLINE)")
        parser.add_argument("--no-listen", action="store_true", help="polling only: no LISTEN connection")
        parser.add_argument("--no-recovery", action="store_true", help="run no recovery loops")
        parser.add_argument(
            "--no-dispatch",
            action="store_true",
            help="recovery only: no listener, no dispatch loop (give recovery its own process and cores)",
        )
        parser.add_argument(
            "--recovery-in-process",
            action="store_true",
            help="run the recovery loops as threads of this process, not in a child process (tests, small setups)",
        )
        parser.add_argument(
            "--recovery-nice",
            type=nice_increment,
            default=None,
            help="how much lower the recovery process's CPU priority is (nice increment 0-19, default 10)",
        )
        # The child's side of the default deployment (runtime.recovery_child); not for operators.
        parser.add_argument("--recovery-child", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--report-fd", type=int, default=None, help=argparse.SUPPRESS)
        # The recovery child as before issue 10's last changes (benchmark A/B): its commits wait for the WAL
        # flush; its rounds do not yield to an outbox backlog.
        parser.add_argument("--recovery-sync-commit", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--recovery-no-yield", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument(
            "--domains", type=domain_list, help="comma-separated domains to run recovery for (default: all)"
        )
        parser.add_argument("--metrics-port", type=port_number, help="serve Prometheus metrics on this port")
        parser.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")

    def handle(self, *args, **options):
        conf = dispatch_settings(
            BATCH_SIZE=options["batch_size"],
            SEND_CONCURRENCY=options["concurrency"],
            POLL_INTERVAL=options["poll_interval"],
            LEASE_SECONDS=options["lease"],
            SHUTDOWN_DEADLINE=options["shutdown_deadline"],
        )
        self._before_starting(options)
        if options.get("recovery_child"):
            return self._recovery_child(conf, options)
        if not options.get("no_dispatch"):
            from dispatch_app.dispatch.loop import check_send_lease

            check_send_lease(conf)  # a lease shorter than a send: exit code 2, naming both settings
        import dispatch_app.runtime.assembly as assembly
        from dispatch_app.runtime.gcfreeze import freeze_startup

        try:
            supervisor = assembly.build(conf, options)
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from None
        require_migrated()  # after the settings' own checks (exit code 2 needs no database)
        require_own_redis()  # another live deployment on this Redis database: refused, naming both

        signals = {"count": 0}
        stopped = threading.Event()

        def on_signal(signum, frame):
            signals["count"] += 1
            if signals["count"] > 1:
                log.warning("second signal: exiting at once", extra={"action": "forced_exit", "domain": "dispatch"})
                os._exit(1)
            log.info(
                "signal %s: stopping (deadline %.1fs)",
                signum,
                conf.SHUTDOWN_DEADLINE,
                extra={"action": "stop_requested", "domain": "dispatch"},
            )
            supervisor.request_stop()
            stopped.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        freeze_startup("dispatch")
        supervisor.start()
        self.stdout.write(f"rundispatcher pid {os.getpid()} started: {', '.join(supervisor.loop_names())}")
        self.stdout.flush()
        # The main thread only waits, so signal handlers run promptly.
        while not stopped.wait(0.5):
            pass
        hung = supervisor.join()
        supervisor.close()
        self.stdout.flush()
        from dispatch_app.runtime.quiesce import quiesce

        quiesce()  # no daemon thread writes while the interpreter finalizes (a fatal error otherwise)
        if hung:
            # Not a clean stop: a supervisor (systemd, Kubernetes) and the operator must see it.
            raise CommandError(f"loops still running at the deadline: {', '.join(hung)}", returncode=EXIT_HUNG)

    def _before_starting(self, options) -> None:
        if not options.get("skip_checks"):
            self.check()
        ensure_logging()  # a project without LOGGING still sees our lines (runtime.default_logging)
        bound_sessions()  # before the first statement, the recovery child's too (runtime.session_bounds)

    def _recovery_child(self, conf, options) -> None:
        import dispatch_app.runtime.assembly as assembly
        import dispatch_app.runtime.recovery_child as recovery_child
        from dispatch_app.domains import domain_keys

        nice = options.get("recovery_nice")
        hung = recovery_child.run(
            conf,
            options.get("domains") or list(domain_keys()),
            report_fd=options.get("report_fd"),
            nice=assembly.DEFAULT_NICE if nice is None else nice,
            out=self.stdout,
            async_commit=not options.get("recovery_sync_commit"),
            yield_to_new_work=not options.get("recovery_no_yield"),
        )
        sys.stdout.flush()
        if hung:
            raise CommandError(f"recovery loops still running at the deadline: {', '.join(hung)}", returncode=EXIT_HUNG)
