"""submit-cost: the client CPU of one ``submit`` against two plain INSERTs in one transaction.

Side by side, interleaved, one job at a time on the bench database (the
envelope triggers armed as with an idle dispatcher, so every variant pays the
same NOTIFY): raw psycopg (BEGIN; job; envelope; COMMIT), the same through
Django's cursor, ``submit`` as it was (validation, ``bulk_create`` x2 inside
``atomic()``), ``submit`` as shipped (validation, one statement), and ``submit`` called inside a recording
OpenTelemetry span (its W3C trace context captured into the same statement; needs requirements/tracing.txt).
CPU is this process's (``time.process_time``), per submit.
"""

from __future__ import annotations

import json
import time
import uuid

from bench import Context, record, side_by_side
from bench.stats import ratio

NAME = "submit-cost"
VARIANTS = ["psycopg-2-inserts", "django-cursor-2-inserts", "submit-orm-before", "submit", "submit-in-span"]

_JOB = (
    "INSERT INTO dispatch_app_job (domain, status, attempt, payload, error, vendor_request_id) "
    "VALUES (%s, 'submitted', 1, %s::jsonb, '', '') RETURNING id"
)
_ENVELOPE = (
    "INSERT INTO dispatch_app_dispatchenvelope (job_id, attempt, domain, queue, status, send_attempts, last_error) "
    "VALUES (%s, 1, %s, %s, 'pending', 0, '')"
)


def _variants(raw):
    from django.db import connection, transaction

    from dispatch_app.config.settings import dispatch_settings
    from dispatch_app.domains import get_domain
    from dispatch_app.domains.demo_payloads import demo_payload
    from dispatch_app.models import DispatchEnvelope, Job
    from dispatch_app.outbox.submit import _validated, submit

    payload = demo_payload("delivery", 0)
    queue = get_domain("delivery").queue

    def psycopg_plain():
        with raw.transaction():
            job_id = raw.execute(_JOB, ["delivery", json.dumps(payload)]).fetchone()[0]
            raw.execute(_ENVELOPE, [job_id, "delivery", queue])

    def django_plain():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_JOB, ["delivery", json.dumps(payload)])
            job_id = cursor.fetchone()[0]
            cursor.execute(_ENVELOPE, [job_id, "delivery", queue])

    def orm_before():
        # The write as it was before the one-statement rewrite (dispatch_app/outbox/submit.py).
        _validated("delivery", payload, None, dispatch_settings().PAYLOAD_MAX_BYTES)
        with transaction.atomic():
            jobs = Job.objects.bulk_create([Job(domain="delivery", payload=payload)])
            envelope = DispatchEnvelope(job=jobs[0], attempt=1, domain="delivery", queue=queue)
            DispatchEnvelope.objects.bulk_create([envelope])

    def shipped():
        submit("delivery", payload)

    def in_span():
        # One recording span made current around each submit; the span itself is made once: its cost is
        # the caller's, the capture (and the larger row) is the submit's.
        if in_span.span is None:
            try:
                from opentelemetry import trace
                from opentelemetry.sdk.trace import TracerProvider
            except ImportError:
                raise RuntimeError("opentelemetry-sdk is not installed (pip install -r requirements/tracing.txt)")
            in_span.span = TracerProvider().get_tracer("bench").start_span("request")
            in_span.use = trace.use_span
        with in_span.use(in_span.span):
            submit("delivery", payload)

    in_span.span = None

    return {
        "psycopg-2-inserts": psycopg_plain,
        "django-cursor-2-inserts": django_plain,
        "submit-orm-before": orm_before,
        "submit": shipped,
        "submit-in-span": in_span,
    }


def run(ctx: Context) -> list[dict]:
    from dispatch_app.dispatch import arming

    env = ctx.env
    count = ctx.size("submit_cost_jobs", 2000, 200)
    env.reset()
    token = uuid.uuid4()
    with env.raw() as admin, env.raw() as raw:
        admin.execute(arming.ARM_SQL, {"token": token, "process": "bench", "lease": 3600})
        fns = _variants(raw)

        def run_one(variant: str, index: int):
            fn = fns[variant]
            for _ in range(20):
                fn()
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(count):
                fn()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            return {"cpu_ms_per_submit": cpu / count * 1000, "wall_ms_per_submit": wall / count * 1000}, {}

        try:
            out = side_by_side(ctx, NAME, VARIANTS, run_one)
        finally:
            admin.execute(arming.DISARM_SQL, {"token": token})
    records = [
        record(NAME, v, {"jobs": count, "one_at_a_time": True}, out["runs"][v], error=out["errors"].get(v))
        for v in VARIANTS
    ]
    base = records[0]["metrics"].get("cpu_ms_per_submit")
    for rec in records:
        rec["metrics"]["cpu_x_plain"] = ratio(rec["metrics"].get("cpu_ms_per_submit"), base)
    return records
