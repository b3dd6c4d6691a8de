"""Pruning removes only what is past retention, in bounded batches."""

from __future__ import annotations

import pytest

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.housekeeping.retention import RetentionLoop, prune
from dispatch_app.models import DispatchEnvelope, DispatcherProcess, JobAttempt, LoopHeartbeat, RecoveryRound
from tests.integration.opsdata import ago, envelope, job, sql

pytestmark = pytest.mark.django_db

DAY = 86_400


def test_prunes_only_rows_past_retention_in_bounded_batches():
    conf = dispatch_settings(RETENTION_BATCH_SIZE=2, RETENTION_MAX_BATCHES=2)
    keep = conf.RETENTION_DISPATCHED_ENVELOPES
    old = [envelope(job(), "dispatched", created_ago=keep + 60, dispatched_ago=keep + 50) for _ in range(5)]
    recent = envelope(job(), "dispatched", created_ago=keep - 120, dispatched_ago=keep - 100)
    old_pending = envelope(job(), "pending", created_ago=keep + 500)
    old_dead = envelope(job(status="failed"), "dead", created_ago=keep + 500)

    for started_ago in (conf.RETENTION_RECOVERY_ROUNDS + 10, conf.RETENTION_RECOVERY_ROUNDS + 20, 60):
        r = RecoveryRound.objects.create(domain="delivery")
        sql(f"UPDATE dispatch_app_recoveryround SET started_at = {ago(started_ago)} WHERE id = %s", [r.pk])

    gone = DispatcherProcess.objects.create(name="gone", hostname="h", pid=1)
    alive = DispatcherProcess.objects.create(name="alive", hostname="h", pid=2)
    LoopHeartbeat.objects.create(process=gone, loop="dispatch")
    LoopHeartbeat.objects.create(process=alive, loop="dispatch")
    sql(
        f"UPDATE dispatch_app_dispatcherprocess SET last_seen_at = {ago(conf.RETENTION_HEARTBEATS + 5)} WHERE id = %s",
        [gone.pk],
    )

    first = prune(conf)
    # Bounded: 2 batches of 2 envelopes, and it says more is left.
    assert (first.envelopes, first.recovery_rounds, first.processes, first.more) == (4, 2, 1, True)
    assert DispatchEnvelope.objects.filter(pk__in=[e.pk for e in old]).count() == 1

    second = RetentionLoop(conf, stop=None).run_once()
    assert (second.envelopes, second.recovery_rounds, second.processes, second.more) == (1, 0, 0, False)

    left = set(DispatchEnvelope.objects.values_list("pk", flat=True))
    assert left == {recent.pk, old_pending.pk, old_dead.pk}
    assert RecoveryRound.objects.count() == 1
    assert list(DispatcherProcess.objects.values_list("name", flat=True)) == ["alive"]
    assert list(LoopHeartbeat.objects.values_list("process__name", flat=True)) == ["alive"]


def test_an_attempt_that_ran_before_its_mark_keeps_its_dispatch_time_when_the_envelope_goes():
    conf = dispatch_settings()
    keep = conf.RETENTION_DISPATCHED_ENVELOPES
    ran_first, marked_first = job(status="succeeded"), job(status="succeeded")
    for j in (ran_first, marked_first):
        envelope(j, "dispatched", created_ago=keep + 60, dispatched_ago=keep + 50)
        JobAttempt.objects.create(job=j, attempt=1, domain=j.domain, outcome="succeeded")
    sql(f"UPDATE dispatch_app_jobattempt SET dispatched_at = {ago(keep + 40)} WHERE job_id = %s", [marked_first.pk])
    expected = dict(DispatchEnvelope.objects.values_list("job_id", "dispatched_at"))
    recorded = JobAttempt.objects.get(job=marked_first).dispatched_at

    assert prune(conf).envelopes == 2

    assert not DispatchEnvelope.objects.exists()
    assert JobAttempt.objects.get(job=ran_first).dispatched_at == expected[ran_first.pk], "copied as it went"
    assert JobAttempt.objects.get(job=marked_first).dispatched_at == recorded, "what the attempt recorded stays"


def test_retention_settings_are_validated():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="RETENTION_DISPATCHED_ENVELOPES"):
        dispatch_settings(RETENTION_DISPATCHED_ENVELOPES=60)
    with pytest.raises(ImproperlyConfigured, match="RETENTION_BATCH_SIZE"):
        dispatch_settings(RETENTION_BATCH_SIZE=0)
