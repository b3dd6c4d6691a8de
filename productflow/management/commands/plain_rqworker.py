"""``manage.py plain_rqworker``: django-rq's own ``rqworker``, for this repository's benchmark peer and tests only.

dispatch_app's ``rqworker`` refuses the project's queues (``dispatch_app/management/commands/_rq_refusal.py``): the
one way to run the project's workers is ``runworkers``. The benchmark still compares that worker with RQ's own
SimpleWorker on the same queue, and a few fault scenarios need a worker that is not the project's (seen only by
its RQ heartbeat): they run django-rq's command through this one, which is not in the wheel (productflow/ is this
repository's project). It runs whatever function a job in Redis names, so it is no way to run workers: it reads
JSON only (another ``--serializer`` is refused; pickle would run code on reading alone) and does not start with
PRODUCTFLOW_ENV=production.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import CommandError
from django_rq.management.commands.rqworker import Command as DjangoRQWorker
from rq.serializers import JSONSerializer, resolve_serializer

JSON = "rq.serializers.JSONSerializer"


class Command(DjangoRQWorker):
    help = "django-rq's own rqworker, JSON only, never in production: the benchmark's RQ peer, the tests' plain worker."

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.set_defaults(serializer=JSON)

    def handle(self, *args, **options):
        if getattr(settings, "PRODUCTION", False):
            raise CommandError(
                "plain_rqworker is for this repository's benchmark and tests and does not run with "
                "PRODUCTFLOW_ENV=production: run workers with 'manage.py runworkers'."
            )
        if resolve_serializer(options["serializer"]) is not JSONSerializer:
            raise CommandError(
                f"plain_rqworker reads JSON only (--serializer {JSON}), not {options['serializer']!r}: another "
                "serializer (pickle) runs code planted in Redis on reading alone."
            )
        return super().handle(*args, **options)
