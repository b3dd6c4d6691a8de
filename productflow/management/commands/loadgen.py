"""``manage.py loadgen --count N [--rate R] [--domains a,b]``: submit valid demo jobs."""

from __future__ import annotations

import sys
import time

from django.core.management.base import BaseCommand

from dispatch_app.domains.demo_payloads import demo_domain_keys, demo_payload
from dispatch_app.management.commands._args import domain_list, positive_float, positive_int
from dispatch_app.outbox.submit import JobSpec, submit_many


def generate(count: int, domains: list[str], rate: float | None, progress=None, group: int = 50) -> tuple[int, int]:
    """Submit ``count`` jobs round-robin over ``domains``; at ``rate`` jobs/s if given.

    Returns (first job id, last job id). Jobs go in small transactions so a
    high rate does not turn into one giant commit.
    """
    first = last = None
    started = time.monotonic()
    sent = 0
    if rate:
        # Small groups keep the pacing close to the asked rate.
        group = max(1, min(group, int(rate // 50) or 1))
    while sent < count:
        size = min(group, count - sent)
        specs = [
            JobSpec(domains[(sent + i) % len(domains)], demo_payload(domains[(sent + i) % len(domains)], sent + i))
            for i in range(size)
        ]
        jobs = submit_many(specs)
        first = jobs[0].pk if first is None else first
        last = jobs[-1].pk
        sent += size
        if progress:
            progress(sent, count)
        if rate:
            ahead = sent / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)  # pacing the load, not waiting for a result
    return first or 0, last or 0


def progress_bar(stream):
    width = 30
    shown = {"filled": -1}

    def show(done: int, total: int) -> None:
        filled = int(width * done / total)
        if filled == shown["filled"] and done != total:
            return
        shown["filled"] = filled
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} jobs submitted")
        if done == total:
            stream.write("\n")
        stream.flush()

    return show


class Command(BaseCommand):
    help = "Submit valid demo jobs through the outbox."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=positive_int, required=True, help="how many jobs")
        parser.add_argument("--rate", type=positive_float, help="jobs per second (default: as fast as possible)")
        parser.add_argument(
            "--domains", type=domain_list, help=f"comma-separated subset of {','.join(demo_domain_keys())}"
        )
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args, **options):
        domains = options["domains"] or demo_domain_keys()
        show = None if options["no_progress"] else progress_bar(sys.stderr)
        first, last = generate(options["count"], domains, options["rate"], show)
        self.stdout.write(f"submitted {options['count']} jobs (ids {first}..{last}) over {', '.join(domains)}")
