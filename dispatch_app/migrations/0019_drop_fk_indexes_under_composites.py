# Three foreign-key indexes repeated the first column of a composite index on the same table: vendorcall_job_seq
# (job_id, seq, id), jobevent_job_at (job_id, at) and loopheartbeat_one_per_loop (process_id, loop) serve every
# lookup by their foreign key, and the parent's cascade delete. So every ledger record and every job event wrote an
# index entry nothing read (issue 27 item 4). The state says db_index=False; the indexes go CONCURRENTLY, so
# ledger records and events go on while they go (tests/integration/store/test_index_prefixes.py keeps it so).

from django.db import migrations, models
from dispatch_app.store.triggers.migration_locks import BoundedMigration

# (model, foreign key, parent, the index Django named for it, its table, its column)
DROPPED = [
    (
        "vendorcall",
        "job",
        "dispatch_app.job",
        "dispatch_app_vendorcall_job_id_40731fde",
        "dispatch_app_vendorcall",
        "job_id",
    ),
    ("jobevent", "job", "dispatch_app.job", "dispatch_app_jobevent_job_id_a4dcc926", "dispatch_app_jobevent", "job_id"),
    (
        "loopheartbeat",
        "process",
        "dispatch_app.dispatcherprocess",
        "dispatch_app_loopheartbeat_process_id_3e55c6bf",
        "dispatch_app_loopheartbeat",
        "process_id",
    ),
]

RELATED = {"vendorcall": "vendor_calls", "jobevent": "events", "loopheartbeat": "loops"}


def _operation(model, field, parent, index, table, column):
    return migrations.SeparateDatabaseAndState(
        state_operations=[
            migrations.AlterField(
                model_name=model,
                name=field,
                field=models.ForeignKey(
                    db_index=False,
                    on_delete=models.deletion.CASCADE,
                    related_name=RELATED[model],
                    to=parent,
                ),
            )
        ],
        database_operations=[
            migrations.RunSQL(
                f'DROP INDEX CONCURRENTLY IF EXISTS "{index}"',
                reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{index}" ON "{table}" ("{column}")',
            )
        ],
    )


class Migration(BoundedMigration):
    atomic = False

    dependencies = [
        ("dispatch_app", "0018_writer_sent_envelopes_announce_nothing"),
    ]

    operations = [_operation(*dropped) for dropped in DROPPED]
