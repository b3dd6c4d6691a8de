"""Where a project enqueues: inside the transaction that writes its own rows.

If anything in the block raises, the tasks and the invoice job vanish with the rollback: no e-mail for an
order that was never placed. If the process dies after the commit, they are in PostgreSQL already and the
dispatcher sends them; nothing waits in memory for an ``on_commit`` hook.
"""

from __future__ import annotations

from django.db import transaction

from dispatch_app import submit
from examples.shop.tasks import make_thumbnail, send_receipt


def place_order(order_id: str, email: str, total_cents: int, image: str) -> dict:
    with transaction.atomic():
        # ... the project's own writes go here (Order.objects.create(...)) ...
        receipt = send_receipt.enqueue(order_id, email)
        thumbnail = make_thumbnail.enqueue(image, width=256)
        invoice = submit("invoice", {"order_id": order_id, "total_cents": total_cents})
    return {"receipt": receipt.id, "thumbnail": thumbnail.id, "invoice": invoice.pk}
