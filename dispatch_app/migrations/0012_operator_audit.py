# Operator audit (issue 26.5, 28.4): the username on JobEvent (survives the user's deletion) and every pause/resume.

import dispatch_app.db.clock
from django.db import migrations, models
from dispatch_app.store.triggers.migration_locks import BoundedMigration


class Migration(BoundedMigration):
    dependencies = [
        ("dispatch_app", "0011_announce_envelopes"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobevent",
            name="actor",
            field=models.CharField(blank=True, db_default="", default="", max_length=150),
        ),
        migrations.CreateModel(
            name="DomainPauseEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("domain", models.CharField(max_length=32)),
                ("at", models.DateTimeField(db_default=dispatch_app.db.clock.ClockTimestamp())),
                ("op", models.CharField(max_length=8)),
                ("actor", models.CharField(blank=True, default="", max_length=150)),
                ("reason", models.TextField(blank=True, default="")),
            ],
            options={
                "indexes": [models.Index(fields=["domain", "at"], name="domainpauseevent_domain_at")],
            },
        ),
    ]
