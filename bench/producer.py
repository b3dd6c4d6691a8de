"""The project's producer as a process of its own: ``python -m bench.producer '<json spec>'``.

Its own process so its CPU is counted apart from the bench's. Modes:

- ``submit``: ``outbox.submit_many`` (the public API: validation, job + envelope,
  the envelope's NOTIFY trigger), `group` jobs per transaction;
- ``inserts``: the floor: two plain INSERTs (job, envelope) in one transaction,
  on the same Django connection; the trigger fires as it does for submit.

Paced at `rate` jobs/s (``rate*0.005`` per transaction, as ``bench.load.submit_paced``)
or flat out when `rate` is 0. Protocol: prints ``ready`` once connected; each ``go <json>`` line (stdin) runs one
phase with those overrides and prints ``result <json>``: job id -> wall time right after its commit
(``time.time()``, comparable with the database's clock on this host), the wall time
of the first submit, and its own CPU seconds over the submissions.
"""

from __future__ import annotations

import json
import os
import sys
import time

INSERT_JOB = """
INSERT INTO dispatch_app_job (domain, status, attempt, payload, error, vendor_request_id, submitted_at, updated_at)
SELECT %s, 'submitted', 1, p::jsonb, '', '', clock_timestamp(), clock_timestamp() FROM unnest(%s::text[]) p
RETURNING id
"""
INSERT_ENVELOPE = """
INSERT INTO dispatch_app_dispatchenvelope (job_id, attempt, domain, queue, status, available_at, send_attempts,
                                           last_error, created_at)
SELECT j, 1, %s, %s, 'pending', clock_timestamp(), 0, '', clock_timestamp() FROM unnest(%s::bigint[]) j
"""


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "productflow.settings")
    import django

    django.setup()
    from django.db import connection, transaction

    from bench.cpu import self_cpu
    from dispatch_app.domains import get_domain
    from dispatch_app.domains.demo_payloads import demo_payload
    from dispatch_app.outbox.submit import JobSpec, submit_many

    base = json.loads(sys.argv[1])
    commits = _stamp_writer_sends()
    connection.ensure_connection()
    print("ready", flush=True)
    # One phase per ``go <json>`` line (the spec's overrides), until ``stop`` or EOF.
    for line in sys.stdin:
        word, _, rest = line.strip().partition(" ")
        if word == "stop":
            return
        if word != "go":
            continue
        spec = dict(base, **json.loads(rest or "{}"))
        commits.clear()
        out = phase(spec, connection, transaction, submit_many, JobSpec, demo_payload, get_domain, self_cpu)
        # A job its writer sent: its commit is when the send began (the send runs before submit_many returns).
        out["committed"].update((job_id, at) for job_id, at in commits.items() if job_id in out["committed"])
        print("result " + json.dumps(out), flush=True)


class _Stamped:
    """The installed writer send (DISPATCH['SUBMIT_SENDS']), noting the wall time its send began per job."""

    def __init__(self, inner, commits: dict):
        self.inner, self.commits = inner, commits

    def ready(self) -> bool:
        return self.inner.ready()

    def send(self, rows) -> int:
        now = time.time()
        self.commits.update((job_id, now) for _, job_id, *_ in rows)
        return self.inner.send(rows)


def _stamp_writer_sends() -> dict:
    import dispatch_app.outbox.submit as outbox

    commits: dict = {}
    inner = outbox.install_writer_send(None)
    outbox.install_writer_send(None if inner is None else _Stamped(inner, commits))
    return commits


def phase(spec, connection, transaction, submit_many, JobSpec, demo_payload, get_domain, self_cpu) -> dict:  # noqa: N803
    domain = spec.get("domain", "delivery")
    queue = get_domain(domain).queue
    count, rate, mode = int(spec["count"]), float(spec.get("rate") or 0), spec.get("mode", "submit")
    group = int(spec.get("group") or (max(1, round(rate * 0.005)) if rate else 1))
    offset = int(spec.get("offset", 0))

    def one_group(first: int, n: int) -> list[int]:
        payloads = [demo_payload(domain, offset + first + i) for i in range(n)]
        if mode == "submit":
            return [job.pk for job in submit_many([JobSpec(domain, p) for p in payloads])]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(INSERT_JOB, [domain, [json.dumps(p) for p in payloads]])
            ids = [row[0] for row in cursor.fetchall()]
            cursor.execute(INSERT_ENVELOPE, [domain, queue, ids])
        return ids

    committed: dict[int, float] = {}
    interval = group / rate if rate else 0.0
    cpu0 = self_cpu()
    t0 = time.time()
    start = time.monotonic()
    sent = index = 0
    while sent < count:
        if interval:
            delay = start + index * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        n = min(group, count - sent)
        ids = one_group(sent, n)
        now = time.time()
        for job_id in ids:
            committed[job_id] = now
        sent += n
        index += 1
    elapsed = time.monotonic() - start
    return {"t0": t0, "elapsed": elapsed, "jobs": sent, "cpu_s": self_cpu() - cpu0, "committed": committed}


if __name__ == "__main__":
    main()
