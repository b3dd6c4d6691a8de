"""Partial edits: the vendor repaints one region of an image (billed per call)."""

from dispatch_app.domains.base import Domain, Field, RecoveryPolicy


def work(ctx) -> dict:
    request_id = ctx.provider.new_request_id()
    ctx.record_vendor_request(request_id)
    path = ctx.provider.edit_image(request_id, ctx.payload["image"], ctx.payload["region"], ctx.payload["instruction"])
    return {"image": str(path)}


def task(job_id: int, attempt: int):
    from dispatch_app.worker import execute

    return execute(DOMAIN.key, job_id, attempt)


DOMAIN = Domain(
    key="partial_edit",
    queue="partial_edit",
    schema={
        "image": Field(str, max_length=1000),
        "region": Field(list, item_kind=int, length=4),
        "instruction": Field(str, max_length=2000),
    },
    task_path="dispatch_app.domains.partial_edit.task",
    work=work,
    recovery=RecoveryPolicy(retry_safe=False, uses_vendor_request_id=True),
    description="region edits of an existing image through the image vendor",
)
