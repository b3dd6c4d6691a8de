"""``manage.py runworkers``: the project's RQ workers, configured the one right way.

All domain queues by default (they must live on one Redis: with domains on their
own servers, run one ``runworkers --queues ...`` per server), the JSON serializer and
``dispatch_app.rqworker.PipelineWorker`` always. The logic is in
dispatch_app.rq.worker.launch.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from dispatch_app.db.session_bounds import bound_sessions
from dispatch_app.management.commands._args import niceness, positive_int
from dispatch_app.management.commands._deployment import require_own_redis
from dispatch_app.management.commands._migrated import require_migrated
from dispatch_app.rq.worker.launch import BadQueues, Plan, default_processes, one_server, parse_queues, run
from dispatch_app.runtime.default_logging import ensure_logging


class Command(BaseCommand):
    help = "Run PipelineWorkers on the domain queues (JSON serializer). SIGTERM finishes the current job, then exits."

    def add_arguments(self, parser):
        parser.add_argument(
            "--queues", help="comma-separated queues to serve (default: every domain queue, in priority order)"
        )
        parser.add_argument(
            "--processes", type=positive_int, default=None, help="worker processes (default: two per core)"
        )
        parser.add_argument(
            "--max-jobs", type=positive_int, help="a worker process exits after this many jobs and is replaced"
        )
        parser.add_argument(
            "--new-lanes-only",
            action="store_true",
            help="a domain queue brings its new lane alone, not its recovery lane (give recovered work workers of "
            "its own: runworkers --queues delivery.recovery --nice 10)",
        )
        parser.add_argument(
            "--nice", type=niceness, default=0, help="run the worker processes this much nicer, 1-19 (default: not)"
        )
        parser.add_argument("--burst", action="store_true", help="drain the queues, then exit")
        parser.add_argument("--log-level", default="INFO", help="worker log level (default INFO)")

    def handle(self, *args, **options):
        try:
            queues = parse_queues(options["queues"])
            one_server(queues)  # refused up front, naming the per-server --queues to run instead
        except BadQueues as exc:
            raise CommandError(str(exc)) from None
        plan = Plan(
            queues=queues,
            processes=options["processes"] or default_processes(),
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            logging_level=options["log_level"].upper(),
            late_lanes=not options["new_lanes_only"],
            nice=options["nice"],
        )
        ensure_logging()
        bound_sessions()
        require_migrated()  # after the queues' own checks
        require_own_redis(list(queues))  # another live deployment on this Redis database: refused, naming both
        run(plan)
