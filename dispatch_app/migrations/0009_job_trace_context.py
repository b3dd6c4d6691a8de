# The submitter's W3C trace context on the job (issue 13 part 3, dispatch_app.timeline.tracing). Nullable, no default:
# adding it rewrites nothing, and an untraced submit writes NULL.

from django.db import migrations, models
from dispatch_app.store.triggers.migration_locks import BoundedMigration


class Migration(BoundedMigration):

    dependencies = [
        ("dispatch_app", "0008_worker_health"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
