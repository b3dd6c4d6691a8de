"""``manage.py dispatchbench [SCENARIO ...]``: the benchmark (bench/), on its own database and Redis db.

Thin: parses options and calls bench.runner; docs/benchmarks.md explains the method.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from dispatch_app.management.commands._args import positive_int


def size_override(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return key.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}") from None


class Command(BaseCommand):
    help = "Benchmark the dispatcher: each removed wait side by side with the design it replaces, and peers."

    def add_arguments(self, parser):
        from bench import SCENARIOS

        parser.add_argument(
            "scenarios", nargs="*", metavar="SCENARIO", help=f"which to run (default: all): {', '.join(SCENARIOS)}"
        )
        parser.add_argument("--quick", action="store_true", help="tiny sizes: every scenario in seconds (CI)")
        parser.add_argument("--repeat", type=positive_int, default=3, help="runs per variant; medians reported")
        parser.add_argument("--out", default="bench-results", help="directory for results.json and the PNGs")
        parser.add_argument(
            "--size",
            action="append",
            type=size_override,
            default=[],
            metavar="KEY=N",
            help="override one scenario size, e.g. drain_envelopes=20000 (keys: docs/benchmarks.md)",
        )
        parser.add_argument(
            "--database-url",
            help="PostgreSQL database to benchmark in (created if missing; default: productflow_bench "
            "on the configured server)",
        )
        parser.add_argument("--bench-db", default="productflow_bench", help="name of the bench's own database")
        parser.add_argument("--redis-url", help="Redis URL incl. db index (default: configured server, --redis-db)")
        parser.add_argument("--redis-db", type=int, default=9, help="Redis db index of the bench (only one flushed)")
        parser.add_argument("--keep-db", action="store_true", help="do not drop the bench database at the end")
        parser.add_argument("--no-plots", action="store_true", help="skip the PNGs")
        parser.add_argument(
            "--keep-logs",
            action="store_true",
            help="keep every child process's log lines (dispatchers, workers, producers, peers) in OUT/logs/",
        )

    def handle(self, *args, **options):
        from bench import SCENARIOS
        from bench.runner import run

        unknown = [s for s in options["scenarios"] if s not in SCENARIOS]
        if unknown:
            raise CommandError(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
        if options["redis_db"] in (0, 15):
            raise CommandError("--redis-db 0 and 15 belong to the demo and the tests; pick another index")
        code = run(
            scenarios=options["scenarios"] or list(SCENARIOS),
            quick=options["quick"],
            repeat=options["repeat"],
            out=Path(options["out"]),
            sizes=dict(options["size"]),
            database_url=options["database_url"],
            bench_db=options["bench_db"],
            redis_url=options["redis_url"],
            redis_db=options["redis_db"],
            keep_db=options["keep_db"],
            plots=not options["no_plots"],
            stdout=self.stdout,
            keep_logs=options["keep_logs"],
        )
        if code:
            raise CommandError("some scenarios failed; see the table and results.json", returncode=code)
