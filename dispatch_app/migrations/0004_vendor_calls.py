# Reserved slot in the migration chain so parallel work could land in a fixed order.
# Vendor-call ledger (issue 11 item 10).

import django.db.models.deletion
from django.db import migrations, models

import dispatch_app.db.clock
from dispatch_app.store.triggers.migration_locks import BoundedMigration


class Migration(BoundedMigration):

    dependencies = [
        ("dispatch_app", "0003_notify_only_claimable"),
    ]

    operations = [
        migrations.CreateModel(
            name="VendorCall",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("attempt", models.PositiveIntegerField()),
                ("seq", models.PositiveIntegerField()),
                ("purpose", models.CharField(max_length=200)),
                ("request_id", models.CharField(blank=True, default="", max_length=200)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("succeeded", "Succeeded"),
                            ("failed", "Failed"),
                            ("unknown", "Unknown"),
                        ],
                        default="pending",
                        max_length=20,
                    ),
                ),
                ("created_at", models.DateTimeField(db_default=dispatch_app.db.clock.ClockTimestamp())),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("result", models.JSONField(blank=True, null=True)),
                ("error", models.TextField(blank=True, default="")),
                (
                    "job",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="vendor_calls",
                        to="dispatch_app.job",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["job", "seq", "id"], name="vendorcall_job_seq")],
            },
        ),
    ]
