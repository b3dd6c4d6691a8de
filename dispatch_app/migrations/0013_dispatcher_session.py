from django.db import migrations, models
from dispatch_app.store.triggers.migration_locks import BoundedMigration


class Migration(BoundedMigration):
    """DispatcherProcess.session: the application_name of the process's liveness session (dispatch_app.db.liveness)."""

    dependencies = [
        ("dispatch_app", "0012_operator_audit"),
    ]

    operations = [
        migrations.AddField(
            model_name="dispatcherprocess",
            name="session",
            field=models.CharField(blank=True, db_default="", default="", max_length=100),
        ),
    ]
