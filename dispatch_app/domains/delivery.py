"""Delivery: push a finished asset to a target; the target de-duplicates, so re-running is safe."""

from dispatch_app.domains.base import Domain, Field, RecoveryPolicy


def work(ctx) -> dict:
    return ctx.provider.deliver(ctx.payload["asset"], ctx.payload["target"])


DOMAIN = Domain(
    key="delivery",
    queue="delivery",
    schema={
        "asset": Field(str, max_length=1000),
        "target": Field(str, max_length=1000),
    },
    work=work,
    recovery=RecoveryPolicy(retry_safe=True, max_attempts=5, running_stale_seconds=300),
    description="image delivery to customer targets (idempotent at the target)",
)
