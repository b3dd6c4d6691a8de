"""``manage.py rundispatcher``: the listener, the dispatch loop and the recovery loops."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from django.core.management.base import BaseCommand, CommandError

from dispatch_app.conf import dispatch_settings
from dispatch_app.management.commands._args import (
    SettingsErrorExit2,
    domain_list,
    port_number,
    positive_float,
    positive_int,
)

log = logging.getLogger("dispatch_app.rundispatcher")


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
        if not options.get("skip_checks"):
            self.check()
        from dispatch_app.runtime import assembly

        try:
            supervisor = assembly.build(conf, options)
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from None

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
        supervisor.start()
        self.stdout.write(f"rundispatcher pid {os.getpid()} started: {', '.join(supervisor.loop_names())}")
        self.stdout.flush()
        # The main thread only waits, so signal handlers run promptly.
        while not stopped.wait(0.5):
            pass
        hung = supervisor.join()
        supervisor.close()
        if hung:
            self.stderr.write(f"loops still running at the deadline: {', '.join(hung)}")
        sys.stdout.flush()
