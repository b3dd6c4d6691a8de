"""Two domains a project declares in its own module, never editing dispatch_app.

Listed in ``PRODUCTFLOW_DOMAINS`` by the tests: ``tests.project.domains`` (the
module: its ``DOMAIN``) and ``tests.project.domains.CAPTIONS`` (a Domain object).
Both share one queue, so one worker serves them.
"""

from dispatch_app.domains import Domain, Field, RecoveryPolicy

# What the work saw, in the worker's process (the tests run an in-process RQ worker).
RAN: list[tuple[str, int, int]] = []


def make_thumbnail(ctx) -> dict:
    RAN.append(("thumbnail", ctx.job_id, ctx.attempt))
    return {"thumbnail": f"{ctx.payload['image']}@{ctx.payload.get('width', 128)}w"}


def write_caption(ctx) -> dict:
    RAN.append(("caption", ctx.job_id, ctx.attempt))
    return {"caption": f"a photo of {ctx.payload['subject']}"}


DOMAIN = Domain(
    key="thumbnail",
    queue="media",
    schema={"image": Field(str, max_length=500), "width": Field(int, required=False, minimum=16, maximum=4096)},
    work=make_thumbnail,
    # Rendering twice writes the same file: an interrupted run is simply run again.
    recovery=RecoveryPolicy(retry_safe=True, max_attempts=4),
    description="thumbnails of uploaded images",
)

CAPTIONS = Domain(
    key="caption",
    queue="media",
    schema={"subject": Field(str, max_length=200)},
    work=write_caption,
    # A billed model call: never run twice on a guess.
    recovery=RecoveryPolicy(retry_safe=False),
    description="captions from a billed model",
)
