# The envelope's and the attempt's job_id had an index of their own beside the unique (job_id, attempt) index,
# which leads with job_id and serves every lookup by job and the cascade: written on every insert and every
# non-HOT update, read by nothing (issue 27 item 4). Dropped CONCURRENTLY, and only the index: Django's own
# AlterField(db_index=False) drops and re-adds the foreign key, whose validation locks both tables (every submit
# waits) while it scans the whole outbox. The state change is the model's; the database change is the DROP INDEX.

from django.db import migrations, models
from dispatch_app.store.triggers.migration_locks import BoundedMigration

ENVELOPE_INDEX = "dispatch_app_dispatchenvelope_job_id_b7f066fc"
ATTEMPT_INDEX = "dispatch_app_jobattempt_job_id_3c74db34"


def _drop(index: str, table: str) -> migrations.RunSQL:
    return migrations.RunSQL(
        f"DROP INDEX CONCURRENTLY IF EXISTS {index}",
        reverse_sql=f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {table} (job_id)",
    )


class Migration(BoundedMigration):
    atomic = False

    dependencies = [
        ("dispatch_app", "0013_dispatcher_session"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="dispatchenvelope",
                    name="job",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="envelopes",
                        to="dispatch_app.job",
                    ),
                ),
                migrations.AlterField(
                    model_name="jobattempt",
                    name="job",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="attempts",
                        to="dispatch_app.job",
                    ),
                ),
            ],
            database_operations=[
                _drop(ENVELOPE_INDEX, "dispatch_app_dispatchenvelope"),
                _drop(ATTEMPT_INDEX, "dispatch_app_jobattempt"),
            ],
        ),
    ]
