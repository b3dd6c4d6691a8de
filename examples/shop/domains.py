"""A payload domain of the shop's own: ``submit("invoice", {...})`` with a schema checked before the write."""

from __future__ import annotations

from dispatch_app.domains import Domain, Field, RecoveryPolicy


def issue_invoice(ctx) -> dict:
    # ctx.payload (validated), ctx.job_id, ctx.attempt; the returned dict is stored as Job.result.
    return {"invoice": f"INV-{ctx.payload['order_id']}", "total_cents": ctx.payload["total_cents"]}


DOMAIN = Domain(
    key="invoice",
    queue="invoices",
    schema={"order_id": Field(str, max_length=64), "total_cents": Field(int, minimum=0)},
    work=issue_invoice,
    # An invoice number is issued once: an interrupted run is outcome_unknown for a person to look at.
    recovery=RecoveryPolicy(retry_safe=False, running_stale_seconds=600),
    description="invoices for placed orders (example app)",
)
