# The claim takes first attempts before later ones (dispatch_app.dispatch.claim): one partial index for each half
# of the claim, read in (available_at, id) order, replacing envelope_claim (all pending envelopes), which the
# planner could pick for the first half and then step over every due re-dispatch. Built CONCURRENTLY: a plain CREATE INDEX would block every submit while it scans the
# whole outbox, history included; the index itself holds only pending first attempts.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models
from dispatch_app.store.triggers.migration_locks import BoundedMigration


class Migration(BoundedMigration):
    atomic = False

    dependencies = [
        ("dispatch_app", "0009_job_trace_context"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="dispatchenvelope",
            index=models.Index(
                condition=models.Q(("attempt", 1), ("status", "pending")),
                fields=["available_at", "id"],
                name="envelope_claim_first",
            ),
        ),
        AddIndexConcurrently(
            model_name="dispatchenvelope",
            index=models.Index(
                condition=models.Q(("attempt__gt", 1), ("status", "pending")),
                fields=["available_at", "id"],
                name="envelope_claim_again",
            ),
        ),
        RemoveIndexConcurrently(model_name="dispatchenvelope", name="envelope_claim"),
    ]
