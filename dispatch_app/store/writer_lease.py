"""The writer's lease: an envelope its own writer sends to RQ after the commit (``DISPATCH['SUBMIT_SENDS']``).

A submit that sends its own envelopes inserts them pending, due now and leased to ``WRITER_TOKEN``: no
dispatcher claims one while it is younger than ``SUBMIT_SEND_GRACE`` (``CLAIM_SKIP``), the insert's trigger does
not announce it (``store.triggers.notify``: only unleased rows wake a dispatcher), and the worker's start marks
it dispatched in the statement that starts the job (``store.transitions.START_SQL``): submit, start and finish
are the job's only round trips to PostgreSQL. A writer that dies between its commit and its send, or cannot
reach Redis, leaves an envelope the dispatcher claims once the grace is over and sends as any other: a wait of
the grace and one fallback tick, never a loss. A job still waiting in RQ when the grace ends is claimed too
and sent again, which RQ's create-if-absent script makes a no-op.

The lease lives in ``lease_token`` only; ``available_at`` stays the submit's (the attempt history's due time,
the dashboard's outbox age and the claim's order read it), so the claim tells the writer's lease by its token.
"""

from __future__ import annotations

import uuid

# Never a dispatcher's (theirs are uuid4, random): a fixed token no claim's compare-and-set can match.
WRITER_TOKEN = uuid.UUID("00000000-0000-4000-8000-000000000001")

# The claim's filter on a pending envelope: not its writer's, or its writer's grace is over. %(writer_grace)s in s.
CLAIM_SKIP = (
    f"(lease_token IS DISTINCT FROM '{WRITER_TOKEN}'::uuid"
    " OR available_at <= clock_timestamp() - make_interval(secs => %(writer_grace)s))"
)
