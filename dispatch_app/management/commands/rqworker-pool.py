"""``manage.py rqworker-pool``: django-rq's, refused on the project's queues naming runworkers (``_rq_refusal``)."""

from dispatch_app.management.commands._rq_refusal import guarded

Command = guarded("rqworker-pool")
