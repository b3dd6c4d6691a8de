"""Workflows: a list of named steps run by our own code, each idempotent."""

from dispatch_app.domains.base import Domain, Field, RecoveryPolicy


def work(ctx) -> dict:
    results = []
    for index, step in enumerate(ctx.payload["steps"]):
        # Idempotent steps, so this is for speed, not safety: a retry skips the steps already done.
        results.append(
            ctx.call_vendor(
                f"step {index}: {step}",
                lambda request_id, step=step: ctx.provider.run_step(
                    step, {"workflow_id": ctx.payload["workflow_id"]}, request_id
                ),
                verifiable=False,
            )
        )
    return {"steps": len(results)}


DOMAIN = Domain(
    key="workflow",
    queue="workflow",
    schema={
        "workflow_id": Field(str, max_length=200),
        "steps": Field(list, item_kind=str, max_length=50),
    },
    work=work,
    recovery=RecoveryPolicy(retry_safe=True, max_attempts=5),
    description="multi-step product workflows; steps are idempotent",
)
