"""Image series: a vendor generates N product images (not idempotent: each call is billed)."""

from dispatch_app.domains.base import Domain, Field, RecoveryPolicy


def work(ctx) -> dict:
    payload = ctx.payload
    count = payload.get("count", 1)
    outputs = []
    for index in range(count):

        def generate(request_id: str, index: int = index) -> dict:
            path = ctx.provider.generate_image(
                request_id, payload["prompt"], payload.get("size", 64), ctx.job_id * 31 + index
            )
            return {"image": str(path), "request_id": request_id}

        # Through the ledger: a retry after image k failed reuses images 1..k-1 instead of billing them again.
        made = ctx.call_vendor(f"image {index + 1} of {count}", generate, verifiable=True)
        outputs.append(made.get("image") or f"vendor request {made['request_id']}")
    return {"images": outputs}


DOMAIN = Domain(
    key="image_series",
    queue="image_series",
    schema={
        "product_id": Field(str, max_length=200),
        "prompt": Field(str, max_length=2000),
        "count": Field(int, required=False, minimum=1, maximum=8),
        "size": Field(int, required=False, minimum=8, maximum=1024),
    },
    work=work,
    recovery=RecoveryPolicy(
        retry_safe=False, uses_vendor_request_id=True, running_stale_seconds=1800, records_vendor_calls=True
    ),
    description="product-image generation through the image vendor",
)
