# Nothing selects attempts by their dispatch time (the dashboard's latency windows read the envelope's, index
# envelope_status_dispatched): jobattempt_dispatched was written by every start and every end of an attempt and
# read by nothing (issue 27 item 4). Dropped CONCURRENTLY, so starts and ends go on while it goes.

from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations
from dispatch_app.store.triggers.migration_locks import BoundedMigration


class Migration(BoundedMigration):
    atomic = False

    dependencies = [
        ("dispatch_app", "0016_envelope_due_row_trigger"),
    ]

    operations = [
        RemoveIndexConcurrently(
            model_name="jobattempt",
            name="jobattempt_dispatched",
        ),
    ]
