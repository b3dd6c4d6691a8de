"""Partial edits: the vendor repaints one region of an image (billed per call)."""

from dispatch_app.domains.base import Domain, Field, RecoveryPolicy


def work(ctx) -> dict:
    payload = ctx.payload

    def edit(request_id: str) -> dict:
        path = ctx.provider.edit_image(request_id, payload["image"], payload["region"], payload["instruction"])
        return {"image": str(path), "request_id": request_id}

    made = ctx.call_vendor("edit", edit, verifiable=True)
    return {"image": made.get("image") or f"vendor request {made['request_id']}"}


DOMAIN = Domain(
    key="partial_edit",
    queue="partial_edit",
    schema={
        "image": Field(str, max_length=1000),
        "region": Field(list, item_kind=int, length=4),
        "instruction": Field(str, max_length=2000),
    },
    work=work,
    recovery=RecoveryPolicy(retry_safe=False, uses_vendor_request_id=True, records_vendor_calls=True),
    description="region edits of an existing image through the image vendor",
)
