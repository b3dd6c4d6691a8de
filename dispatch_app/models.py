"""Jobs, their dispatch envelopes (the outbox), history, recovery rounds, heartbeats.

All timestamps are written by PostgreSQL (``clock_timestamp()``), never by a host.
"""

from __future__ import annotations

import pgtrigger
from django.db import models
from django.db.models import Q

import dispatch_app.store.triggers.history as history_triggers
import dispatch_app.store.triggers.notify as notify_triggers
from dispatch_app.db.clock import ClockTimestamp
from dispatch_app.store.triggers.install import Trigger


class JobStatus(models.TextChoices):
    SUBMITTED = "submitted"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (JobStatus.SUBMITTED, JobStatus.QUEUED, JobStatus.RUNNING)
TERMINAL_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.OUTCOME_UNKNOWN, JobStatus.CANCELLED)


class EnvelopeStatus(models.TextChoices):
    PENDING = "pending"
    DISPATCHED = "dispatched"
    DEAD = "dead"


class Job(models.Model):
    domain = models.CharField(max_length=32)
    status = models.CharField(max_length=20, choices=JobStatus.choices, default=JobStatus.SUBMITTED)
    attempt = models.PositiveIntegerField(default=1)
    payload = models.JSONField()
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    # Recorded before a non-idempotent vendor call, so recovery can ask the vendor.
    vendor_request_id = models.CharField(max_length=200, blank=True, default="")
    submitted_at = models.DateTimeField(db_default=ClockTimestamp())
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Database time of the row's last change: a trigger stamps every UPDATE that leaves the column as it was, so no
    # writer can forget it or use host time; the hot statements (store.transitions) set it themselves and so skip
    # the trigger's call, and a statement that sets it on purpose (a test aging a job) keeps its value.
    updated_at = models.DateTimeField(db_default=ClockTimestamp())
    # The submitter's W3C trace context ({"traceparent": ..., "tracestate": ...}) when it ran inside a span
    # (dispatch_app.timeline.tracing); the dispatcher's and worker's stage spans join that trace. NULL: not traced.
    trace_context = models.JSONField(null=True, blank=True)

    class Meta:
        indexes = [
            # Recovery discovery: ORDER BY updated_at, id over one domain's unfinished jobs.
            models.Index(
                fields=["domain", "updated_at", "id"],
                condition=Q(status__in=["submitted", "queued", "running"]),
                name="job_recovery_candidates",
            ),
            models.Index(fields=["status", "domain"], name="job_status_domain"),
            models.Index(fields=["submitted_at"], name="job_submitted_at"),
        ]
        # Operator actions (dispatch_app.admin), each granted on its own.
        permissions = [
            ("retry_job", "Can retry a job now (through the outbox)"),
            ("cancel_job", "Can cancel a job"),
            ("view_dispatch_dashboard", "Can view the dispatch dashboard"),
        ]
        triggers = [
            Trigger(
                name="job_updated_at_v2",
                level=pgtrigger.Row,
                when=pgtrigger.Before,
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition("NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at"),
                func="NEW.updated_at = clock_timestamp(); RETURN NEW;",
            ),
            Trigger(
                name="job_attempt_history_v1",
                level=pgtrigger.Row,
                when=pgtrigger.After,
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition(history_triggers.JOB_CONDITION),
                declare=history_triggers.JOB_DECLARE,
                func=history_triggers.JOB_FUNC,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.domain} job {self.pk} (attempt {self.attempt}, {self.status})"


class DispatchEnvelope(models.Model):
    """The durable intent "send job J, attempt N, to queue Q"."""

    # No index of its own: the unique (job, attempt) index leads with job and serves every lookup by job (and the
    # cascade); a second one was written on every insert and every update, read by nothing (issue 27 item 4).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="envelopes", db_index=False)
    attempt = models.PositiveIntegerField()
    domain = models.CharField(max_length=32)
    queue = models.CharField(max_length=64)
    status = models.CharField(max_length=20, choices=EnvelopeStatus.choices, default=EnvelopeStatus.PENDING)
    # When it may be claimed: the submit time, a backoff, or the end of a lease.
    available_at = models.DateTimeField(db_default=ClockTimestamp())
    lease_token = models.UUIDField(null=True, blank=True)
    send_attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=ClockTimestamp())
    dispatched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt"], name="envelope_one_per_attempt"),
        ]
        indexes = [
            # Serve the claim (status='pending' AND available_at <= now() ORDER BY
            # available_at, id) in order with no Sort: first attempts before later ones
            # (dispatch_app.store.claim), each half from its own index; every pending
            # envelope is in exactly one of them. Partial rather than (status,
            # available_at, id): dispatched rows, the vast majority, are not in them at
            # all. `dispatchbench index` (300k dispatched, 10k pending, one such index):
            # the same plan and claim rate (21.4k vs 20.8k/s), but 0.32 MB against 15.1
            # MB, so they stay in cache as the table grows.
            models.Index(
                fields=["available_at", "id"],
                condition=Q(status="pending", attempt=1),
                name="envelope_claim_first",
            ),
            models.Index(
                fields=["available_at", "id"],
                condition=Q(status="pending", attempt__gt=1),
                name="envelope_claim_again",
            ),
            models.Index(fields=["status", "dispatched_at"], name="envelope_status_dispatched"),
        ]
        permissions = [
            ("retry_envelope", "Can make a pending envelope due now"),
            ("rearm_envelope", "Can re-arm a dead envelope"),
        ]
        triggers = [
            Trigger(
                name="envelope_notify_insert_v4",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                referencing=pgtrigger.Referencing(new="new_rows"),
                func=notify_triggers.NOTIFY_INSERTED,
            ),
            Trigger(
                name="envelope_notify_rearm_v4",
                level=pgtrigger.Row,
                when=pgtrigger.After,
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition(notify_triggers.REARMED_WHEN),
                func=notify_triggers.NOTIFY_REARMED,
            ),
            Trigger(
                name="envelope_attempt_due_v2",
                level=pgtrigger.Row,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                condition=pgtrigger.Condition(history_triggers.ENVELOPE_DUE_WHEN),
                func=history_triggers.ENVELOPE_DUE_FUNC,
            ),
        ]

    def __str__(self) -> str:
        return f"envelope {self.pk} ({self.domain} job {self.job_id} attempt {self.attempt}, {self.status})"


class NotifyArm(models.Model):
    """One row per dispatcher: while ``armed_until`` is ahead, writers announce new work.

    Written only by dispatchers (dispatch_app.dispatch.arming); writers only read it.
    A lease, so a dispatcher that dies armed stops costing the writers when it runs out.
    """

    token = models.UUIDField(primary_key=True)
    process = models.CharField(max_length=200, blank=True, default="")
    armed_at = models.DateTimeField(db_default=ClockTimestamp())
    armed_until = models.DateTimeField()


class JobEvent(models.Model):
    """A job's history beyond its timestamps: send failures, recovery decisions, operator actions."""

    # No index of its own: jobevent_job_at (job, at) serves every lookup by job (migration 0019).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events", db_index=False)
    at = models.DateTimeField(db_default=ClockTimestamp())
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    reason = models.TextField(blank=True, default="")
    data = models.JSONField(null=True, blank=True)
    # The operator's username, kept as text: the admin's LogEntry goes with a deleted user (its foreign key
    # cascades); this audit does not. Empty for the dispatcher's, the workers' and recovery's own events
    # (a database default: the claim and the triggers insert events in SQL without naming it).
    actor = models.CharField(max_length=150, blank=True, default="", db_default="")

    class Meta:
        indexes = [models.Index(fields=["job", "at"], name="jobevent_job_at")]

    def __str__(self) -> str:
        return f"{self.kind} on job {self.job_id} at {self.at}"


class VendorCallStatus(models.TextChoices):
    PENDING = "pending"  # recorded, the call is being made (or the caller died making it)
    SUCCEEDED = "succeeded"  # took effect; its result is kept for a retry to reuse
    FAILED = "failed"  # known not to have taken effect: a retry makes it again
    UNKNOWN = "unknown"  # no answer (timeout, crash mid-call): ask the vendor before anything else


class VendorCall(models.Model):
    """One vendor call of a job (dispatch_app.store.vendor_calls): recorded before it is made, settled after.

    ``seq`` is the call's position in the domain's work, the same in every attempt,
    so a retry finds what an earlier attempt already did and resumes after it.
    """

    # No index of its own: vendorcall_job_seq (job, seq, id) serves every lookup by job (migration 0019).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="vendor_calls", db_index=False)
    attempt = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    purpose = models.CharField(max_length=200)
    request_id = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=20, choices=VendorCallStatus.choices, default=VendorCallStatus.PENDING)
    created_at = models.DateTimeField(db_default=ClockTimestamp())
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["job", "seq", "id"], name="vendorcall_job_seq")]

    def __str__(self) -> str:
        return f"vendor call {self.seq} ({self.purpose}) of job {self.job_id} attempt {self.attempt}: {self.status}"


class JobAttempt(models.Model):
    """One attempt of a job, written only by triggers (dispatch_app.store.triggers.history), never overwritten
    by a later attempt. Stage times are computed from it by dispatch_app.timeline.stages."""

    # No index of its own, as for the envelope's: the unique (job, attempt) index serves every lookup by job.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts", db_index=False)
    attempt = models.PositiveIntegerField()
    domain = models.CharField(max_length=32)
    # Attempt 1: the submit; later attempts: the re-dispatch that made them.
    created_at = models.DateTimeField(db_default=ClockTimestamp())
    # When its envelope first became claimable, if later than created_at (scheduled submit, retry backoff).
    due_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)
    # A job status it ended in, "superseded" (a later attempt replaced it), or "" while it goes on.
    outcome = models.CharField(max_length=20, blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "attempt"], name="jobattempt_one_per_attempt")]
        # The dashboard's, alarms' and metrics' windows of finished attempts. Nothing selects attempts by their
        # dispatch (the latency windows read the envelope's, index envelope_status_dispatched): that index was
        # written by every start and every end, read by nothing, and kept the start's update from being HOT.
        indexes = [models.Index(fields=["finished_at"], name="jobattempt_finished")]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} ({self.outcome or 'ongoing'})"


class RecoveryRound(models.Model):
    domain = models.CharField(max_length=32)
    process = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField(db_default=ClockTimestamp())
    finished_at = models.DateTimeField(null=True, blank=True)
    scanned = models.PositiveIntegerField(default=0)
    redispatched = models.PositiveIntegerField(default=0)
    left_alone = models.PositiveIntegerField(default=0)
    unknown = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    has_more = models.BooleanField(default=False)
    oldest_candidate_age = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["domain", "started_at"], name="recoveryround_domain_started")]


class DispatcherProcess(models.Model):
    """One running ``rundispatcher``; its loops report their last good tick."""

    name = models.CharField(max_length=200, unique=True)
    hostname = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField(db_default=ClockTimestamp())
    last_seen_at = models.DateTimeField(db_default=ClockTimestamp())
    stopped_at = models.DateTimeField(null=True, blank=True)
    # The application_name of its liveness session (dispatch_app.db.liveness): gone from pg_stat_activity the moment
    # the process dies. Empty: none (yet); it is judged by last_seen_at alone.
    session = models.CharField(max_length=100, blank=True, default="", db_default="")


class LoopHeartbeat(models.Model):
    # No index of its own: the unique (process, loop) serves every lookup by process (migration 0019).
    process = models.ForeignKey(DispatcherProcess, on_delete=models.CASCADE, related_name="loops", db_index=False)
    loop = models.CharField(max_length=64)
    last_tick_at = models.DateTimeField(null=True, blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    errors = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["process", "loop"], name="loopheartbeat_one_per_loop")]


class DomainPause(models.Model):
    """An operator paused dispatch of this domain: its envelopes stay pending and the claim passes them over.

    One row per paused domain; resuming deletes the row (the admin log keeps who did what, and when).
    """

    domain = models.CharField(max_length=32, unique=True)
    paused_at = models.DateTimeField(db_default=ClockTimestamp())
    paused_by = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")

    class Meta:
        permissions = [("pause_domain", "Can pause and resume dispatch of a domain")]

    def __str__(self) -> str:
        return f"{self.domain} paused"


class DomainPauseEvent(models.Model):
    """Every pause and resume of a domain, kept after the resume deletes its DomainPause row: the audit trail
    of who paused what and why (it survives the deletion of the operator's user), and the pauses a job's
    timeline shows."""

    domain = models.CharField(max_length=32)
    at = models.DateTimeField(db_default=ClockTimestamp())
    op = models.CharField(max_length=8)  # pause | resume
    actor = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["domain", "at"], name="domainpauseevent_domain_at")]

    def __str__(self) -> str:
        return f"{self.domain} {self.op} by {self.actor or 'system'}"
