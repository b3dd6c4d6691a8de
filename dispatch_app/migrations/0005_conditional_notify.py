# Reserved slot in the migration chain so parallel work could land in a fixed order.
# NOTIFY only when a dispatcher is armed (issue 10 part 1): the arm table dispatchers
# write and writers read, and the envelope triggers that notify only while one is armed.

import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models

import dispatch_app.db.clock
from dispatch_app.store.triggers.migration_locks import BoundedMigration


class Migration(BoundedMigration):

    dependencies = [
        ("dispatch_app", "0004_vendor_calls"),
    ]

    operations = [
        migrations.CreateModel(
            name="NotifyArm",
            fields=[
                ("token", models.UUIDField(primary_key=True, serialize=False)),
                ("process", models.CharField(blank=True, default="", max_length=200)),
                ("armed_at", models.DateTimeField(db_default=dispatch_app.db.clock.ClockTimestamp())),
                ("armed_until", models.DateTimeField()),
            ],
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name="dispatchenvelope",
            name="envelope_notify_insert_v1",
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name="dispatchenvelope",
            name="envelope_notify_rearm_v2",
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="dispatchenvelope",
            trigger=pgtrigger.compiler.Trigger(
                name="envelope_notify_insert_v2",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    func="IF current_setting('transaction_isolation') <> 'read committed' OR EXISTS (SELECT 1 FROM dispatch_app_notifyarm WHERE armed_until > statement_timestamp()) THEN PERFORM pg_notify('productflow_dispatch_v1', d.domain) FROM (SELECT DISTINCT domain FROM new_rows WHERE status = 'pending') d; END IF; RETURN NULL;",  # noqa: E501
                    hash="2334743387c78ad55ed63c4c4d36520eb3166444",
                    level="STATEMENT",
                    operation="INSERT",
                    pgid="pgtrigger_envelope_notify_insert_v2_2916b",
                    referencing="REFERENCING NEW TABLE AS new_rows ",
                    table="dispatch_app_dispatchenvelope",
                    when="AFTER",
                ),
            ),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="dispatchenvelope",
            trigger=pgtrigger.compiler.Trigger(
                name="envelope_notify_rearm_v3",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    func="IF current_setting('transaction_isolation') <> 'read committed' OR EXISTS (SELECT 1 FROM dispatch_app_notifyarm WHERE armed_until > statement_timestamp()) THEN PERFORM pg_notify('productflow_dispatch_v1', d.domain) FROM ( SELECT DISTINCT n.domain FROM new_rows n JOIN old_rows o ON o.id = n.id WHERE n.status = 'pending' AND n.lease_token IS NULL AND n.available_at <= clock_timestamp() AND (o.status <> 'pending' OR o.lease_token IS NOT NULL OR n.available_at < o.available_at)) d; END IF; RETURN NULL;",  # noqa: E501
                    hash="83601287f2ccec29077ee7d050c110176adf2651",
                    level="STATEMENT",
                    operation="UPDATE",
                    pgid="pgtrigger_envelope_notify_rearm_v3_ca7af",
                    referencing="REFERENCING OLD TABLE AS old_rows  NEW TABLE AS new_rows ",
                    table="dispatch_app_dispatchenvelope",
                    when="AFTER",
                ),
            ),
        ),
    ]
