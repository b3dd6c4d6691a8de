"""django-rq's worker commands, refused on the project's queues: ``manage.py runworkers`` is the one way to run them.

django-rq's ``rqworker`` and ``rqworker-pool`` read job hashes with RQ's default serializer (pickle) unless given
``--serializer``, and on JSON still run whatever function a hash names (``os.system`` included), whatever
``--worker-class`` says about the rest: a forged job in Redis is code on the worker. ``runworkers`` reads JSON only
and admits a job only when it is exactly what the dispatcher sends. So these commands refuse to start, before they
connect to Redis, when asked for any queue or lane of a declared domain (no queue named: django-rq serves
``"default"``, which is then looked up the same way), and hand anything else to django-rq's own command unchanged.
Django takes a command from the first app in INSTALLED_APPS that has it: ``dispatch_app`` comes before
``django_rq`` (``dispatch_app.rq.checks`` fails the checks otherwise).
"""

from __future__ import annotations

from importlib import import_module

from django.core.management.base import BaseCommand, CommandError

import dispatch_app.domains.lanes as lanes
from dispatch_app.domains import queue_names

DJANGO_RQ_DEFAULT_QUEUE = "default"  # what django-rq's commands serve when no queue is named


def project_queues(asked) -> list[str]:
    """The queues asked for (django-rq's default when none) that are a declared domain's queue or one of its lanes."""
    declared = set(queue_names())
    return [name for name in (list(asked) or [DJANGO_RQ_DEFAULT_QUEUE]) if lanes.split(name)[0] in declared]


def refusal(command: str, queues: list[str]) -> str:
    shown = ", ".join(queues[:5]) + (f" and {len(queues) - 5} more" if len(queues) > 5 else "")
    return (
        f"'manage.py {command}' refuses the project's queues ({shown}): django-rq's worker runs whatever function "
        "a job hash in Redis names, read with pickle by default; run them with 'manage.py runworkers' "
        "(--queues a,b to choose)."
    )


def guarded(command: str) -> type[BaseCommand]:
    """django-rq's ``command``, refusing the project's queues and otherwise exactly django-rq's."""
    base = import_module(f"django_rq.management.commands.{command}").Command

    class Command(base):
        help = f"django-rq's {command}, for queues that are not the project's (those: manage.py runworkers)."

        def handle(self, *args, **options):
            refused = project_queues(args)
            if refused:
                raise CommandError(refusal(command, refused))
            return super().handle(*args, **options)

    return Command
