"""Agent runs: an LLM agent calls tools with side effects nobody can check afterwards."""

from dispatch_app.domains.base import Domain, Field, RecoveryPolicy


def work(ctx) -> dict:
    steps = [
        ctx.provider.run_step(f"agent-step-{i}", {"goal": ctx.payload["goal"]})
        for i in range(ctx.payload.get("max_steps", 1))
    ]
    return {"steps": len(steps)}


def task(job_id: int, attempt: int):
    from dispatch_app.worker import execute

    return execute(DOMAIN.key, job_id, attempt)


DOMAIN = Domain(
    key="agent",
    queue="agent",
    schema={
        "goal": Field(str, max_length=4000),
        "max_steps": Field(int, required=False, minimum=1, maximum=50),
    },
    task_path="dispatch_app.domains.agent.task",
    work=work,
    recovery=RecoveryPolicy(retry_safe=False, running_stale_seconds=3600),
    description="agent runs with unverifiable tool side effects",
)
