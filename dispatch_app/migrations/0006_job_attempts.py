# Per-attempt history (issue 12): JobAttempt, kept by triggers (dispatch_app/history_triggers.py),
# and a backfill: earlier attempts from their envelopes, the current attempt from the job row.

import dispatch_app.db.clock
import django.db.models.deletion
import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models
from dispatch_app.store.triggers.migration_locks import BoundedMigration

# A copy of dispatch_app.history_triggers.BACKFILL_SQL as it was when this migration was written.
BACKFILL_SQL = """INSERT INTO dispatch_app_jobattempt (job_id, attempt, domain, created_at, due_at, dispatched_at, started_at, worker, finished_at, outcome, error)
SELECT e.job_id, e.attempt, e.domain, e.created_at, NULL, e.dispatched_at, NULL, '',
       (SELECT min(n.created_at) FROM dispatch_app_dispatchenvelope n
        WHERE n.job_id = e.job_id AND n.attempt > e.attempt), 'superseded', ''
FROM dispatch_app_dispatchenvelope e JOIN dispatch_app_job j ON j.id = e.job_id
WHERE e.attempt < j.attempt
ON CONFLICT (job_id, attempt) DO NOTHING;
INSERT INTO dispatch_app_jobattempt (job_id, attempt, domain, created_at, due_at, dispatched_at, started_at, worker, finished_at, outcome, error)
SELECT j.id, j.attempt, j.domain, COALESCE(e.created_at, j.submitted_at), NULL,
       COALESCE(e.dispatched_at, CASE WHEN j.attempt = 1 THEN j.dispatched_at END), j.started_at, '',
       CASE WHEN j.status IN ('succeeded', 'failed', 'outcome_unknown', 'cancelled') THEN COALESCE(j.finished_at, j.updated_at) END,
       CASE WHEN j.status IN ('succeeded', 'failed', 'outcome_unknown', 'cancelled') THEN j.status ELSE '' END, left(j.error, 8000)
FROM dispatch_app_job j
LEFT JOIN dispatch_app_dispatchenvelope e ON e.job_id = j.id AND e.attempt = j.attempt
ON CONFLICT (job_id, attempt) DO NOTHING;
"""


class Migration(BoundedMigration):

    dependencies = [
        ("dispatch_app", "0005_conditional_notify"),
    ]

    operations = [
        migrations.CreateModel(
            name='JobAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('attempt', models.PositiveIntegerField()),
                ('domain', models.CharField(max_length=32)),
                ('created_at', models.DateTimeField(db_default=dispatch_app.db.clock.ClockTimestamp())),
                ('due_at', models.DateTimeField(blank=True, null=True)),
                ('dispatched_at', models.DateTimeField(blank=True, null=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('worker', models.CharField(blank=True, default='', max_length=200)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('outcome', models.CharField(blank=True, default='', max_length=20)),
                ('error', models.TextField(blank=True, default='')),
            ],
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='dispatchenvelope',
            trigger=pgtrigger.compiler.Trigger(name='envelope_attempt_due_v1', sql=pgtrigger.compiler.UpsertTriggerSql(func="\nINSERT INTO dispatch_app_jobattempt AS a (job_id, attempt, domain, created_at, due_at, dispatched_at, started_at, worker, finished_at, outcome, error)\nSELECT n.job_id, n.attempt, n.domain, n.created_at, n.available_at, NULL, NULL, '', NULL, '', ''\nFROM new_rows n WHERE n.available_at > n.created_at\nON CONFLICT (job_id, attempt) DO UPDATE SET due_at = EXCLUDED.due_at;\nRETURN NULL;\n", hash='507cb0f3a0c4e403021df6c72f6ad9c266bdc6cf', level='STATEMENT', operation='INSERT', pgid='pgtrigger_envelope_attempt_due_v1_10a9c', referencing='REFERENCING NEW TABLE AS new_rows ', table='dispatch_app_dispatchenvelope', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='job',
            trigger=pgtrigger.compiler.Trigger(name='job_attempt_history_v1', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (OLD.attempt IS DISTINCT FROM NEW.attempt OR (OLD.status IS DISTINCT FROM NEW.status AND NOT (OLD.status = 'submitted' AND NEW.status = 'queued')))", declare='DECLARE at_ timestamptz; worker_ text; env_created_ timestamptz; env_dispatched_ timestamptz;', func="\n    at_ := clock_timestamp();\n    IF NEW.attempt IS DISTINCT FROM OLD.attempt THEN\n        -- The old attempt ends here, superseded; what it recorded itself stays.\n        SELECT e.created_at, e.dispatched_at INTO env_created_, env_dispatched_ FROM dispatch_app_dispatchenvelope e WHERE e.job_id = OLD.id AND e.attempt = OLD.attempt;\n        INSERT INTO dispatch_app_jobattempt AS a (job_id, attempt, domain, created_at, due_at, dispatched_at, started_at, worker, finished_at, outcome, error)\n        VALUES (OLD.id, OLD.attempt, OLD.domain, COALESCE(env_created_, CASE WHEN OLD.attempt = 1 THEN OLD.submitted_at ELSE at_ END),\n                NULL, env_dispatched_, OLD.started_at, '', at_, 'superseded', left(OLD.error, 8000))\n        ON CONFLICT (job_id, attempt) DO UPDATE SET\n            dispatched_at = COALESCE(a.dispatched_at, EXCLUDED.dispatched_at),\n            started_at = COALESCE(a.started_at, EXCLUDED.started_at),\n            finished_at = COALESCE(a.finished_at, EXCLUDED.finished_at),\n            outcome = CASE WHEN a.outcome = '' THEN EXCLUDED.outcome ELSE a.outcome END,\n            error = CASE WHEN a.error = '' THEN EXCLUDED.error ELSE a.error END;\n        INSERT INTO dispatch_app_jobattempt AS a (job_id, attempt, domain, created_at, due_at, dispatched_at, started_at, worker, finished_at, outcome, error)\n        VALUES (NEW.id, NEW.attempt, NEW.domain, at_, NULL, NULL, NULL, '', NULL, '', '')\n        ON CONFLICT (job_id, attempt) DO NOTHING;\n    ELSIF NEW.status = 'running' THEN\n        worker_ := left(COALESCE(current_setting('productflow.worker', true), ''), 200);\n        SELECT e.created_at, e.dispatched_at INTO env_created_, env_dispatched_ FROM dispatch_app_dispatchenvelope e WHERE e.job_id = NEW.id AND e.attempt = NEW.attempt;\n        -- The dispatcher's mark may not have committed yet (the worker can be first): then the end fills it.\n        INSERT INTO dispatch_app_jobattempt AS a (job_id, attempt, domain, created_at, due_at, dispatched_at, started_at, worker, finished_at, outcome, error)\n        VALUES (NEW.id, NEW.attempt, NEW.domain, COALESCE(env_created_, CASE WHEN NEW.attempt = 1 THEN NEW.submitted_at ELSE at_ END),\n                NULL, env_dispatched_, COALESCE(NEW.started_at, at_), worker_, NULL, '', '')\n        ON CONFLICT (job_id, attempt) DO UPDATE SET\n            dispatched_at = COALESCE(a.dispatched_at, EXCLUDED.dispatched_at),\n            started_at = EXCLUDED.started_at,\n            worker = CASE WHEN EXCLUDED.worker = '' THEN a.worker ELSE EXCLUDED.worker END;\n    ELSIF NEW.status IN ('succeeded', 'failed', 'outcome_unknown', 'cancelled') THEN\n        SELECT e.created_at, e.dispatched_at INTO env_created_, env_dispatched_ FROM dispatch_app_dispatchenvelope e WHERE e.job_id = NEW.id AND e.attempt = NEW.attempt;\n        INSERT INTO dispatch_app_jobattempt AS a (job_id, attempt, domain, created_at, due_at, dispatched_at, started_at, worker, finished_at, outcome, error)\n        VALUES (NEW.id, NEW.attempt, NEW.domain, COALESCE(env_created_, CASE WHEN NEW.attempt = 1 THEN NEW.submitted_at ELSE at_ END),\n                NULL, env_dispatched_, NEW.started_at, '', COALESCE(NEW.finished_at, at_),\n                NEW.status, left(NEW.error, 8000))\n        ON CONFLICT (job_id, attempt) DO UPDATE SET\n            dispatched_at = COALESCE(a.dispatched_at, EXCLUDED.dispatched_at),\n            started_at = COALESCE(a.started_at, EXCLUDED.started_at),\n            finished_at = EXCLUDED.finished_at,\n            outcome = EXCLUDED.outcome,\n            error = EXCLUDED.error;\n    ELSIF OLD.status IN ('succeeded', 'failed', 'outcome_unknown', 'cancelled') THEN\n        -- Re-opened for the same attempt (a re-armed dead envelope): the attempt goes on.\n        UPDATE dispatch_app_jobattempt SET finished_at = NULL, outcome = ''\n        WHERE job_id = NEW.id AND attempt = NEW.attempt;\n    END IF;\n    RETURN NULL;\n", hash='fd250b6fc47d95a188e519144254e9fdf9e29576', operation='UPDATE', pgid='pgtrigger_job_attempt_history_v1_dcdca', table='dispatch_app_job', when='AFTER')),
        ),
        migrations.AddField(
            model_name='jobattempt',
            name='job',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='attempts', to='dispatch_app.job'),
        ),
        migrations.AddIndex(
            model_name='jobattempt',
            index=models.Index(fields=['dispatched_at'], name='jobattempt_dispatched'),
        ),
        migrations.AddIndex(
            model_name='jobattempt',
            index=models.Index(fields=['finished_at'], name='jobattempt_finished'),
        ),
        migrations.AddConstraint(
            model_name='jobattempt',
            constraint=models.UniqueConstraint(fields=('job', 'attempt'), name='jobattempt_one_per_attempt'),
        ),
        migrations.RunSQL(BACKFILL_SQL, migrations.RunSQL.noop),
    ]
