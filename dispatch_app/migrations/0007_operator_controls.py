# Reserved slot in the migration chain so parallel work could land in a fixed order.
# Operator controls: per-domain pause and the like (issue 12).

from django.db import migrations, models

import dispatch_app.db.clock
from dispatch_app.store.triggers.migration_locks import BoundedMigration


class Migration(BoundedMigration):
    dependencies = [
        ("dispatch_app", "0006_job_attempts"),
    ]

    operations = [
        migrations.CreateModel(
            name="DomainPause",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("domain", models.CharField(max_length=32, unique=True)),
                ("paused_at", models.DateTimeField(db_default=dispatch_app.db.clock.ClockTimestamp())),
                ("paused_by", models.CharField(blank=True, default="", max_length=150)),
                ("reason", models.TextField(blank=True, default="")),
            ],
            options={
                "permissions": [("pause_domain", "Can pause and resume dispatch of a domain")],
            },
        ),
    ]
