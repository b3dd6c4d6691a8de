"""Agent runs: an LLM agent calls tools with side effects nobody can check afterwards."""

from dispatch_app.domains.base import Domain, Field, RecoveryPolicy


def work(ctx) -> dict:
    steps = []
    for i in range(ctx.payload.get("max_steps", 1)):
        name = f"agent-step-{i}"
        # Through the ledger: a retry re-runs only from the step that failed. The tools keep no
        # record the vendor could be asked about, so a step in doubt stays in doubt (outcome_unknown).
        steps.append(
            ctx.call_vendor(
                name,
                lambda request_id, name=name: ctx.provider.run_step(name, {"goal": ctx.payload["goal"]}, request_id),
                verifiable=False,
            )
        )
    return {"steps": len(steps)}


DOMAIN = Domain(
    key="agent",
    queue="agent",
    schema={
        "goal": Field(str, max_length=4000),
        "max_steps": Field(int, required=False, minimum=1, maximum=50),
    },
    work=work,
    recovery=RecoveryPolicy(retry_safe=False, running_stale_seconds=3600, records_vendor_calls=True),
    description="agent runs with unverifiable tool side effects",
)
