"""The job and envelope lists' filters; every age is cut on the database clock (clock_timestamp() - interval)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, Value

from dispatch_app.admin.common import older_than
from dispatch_app.admin.untrusted import parse_id
from dispatch_app.db.clock import ClockTimestamp
from dispatch_app.domains import domain_keys
from dispatch_app.models import JobAttempt, JobEvent
from dispatch_app.recovery.event_kinds import COUNT_EVENTS


class DomainFilter(admin.SimpleListFilter):
    """The declared domains (dispatch_app.domains registry), then any key still in the table that no longer is."""

    title = "domain"
    parameter_name = "domain__exact"  # the dashboard's links use the field filter's parameter

    def lookups(self, request, model_admin):
        declared = domain_keys()
        seen = model_admin.get_queryset(request).order_by().values_list("domain", flat=True).distinct()
        retired = sorted(set(seen) - set(declared))
        return [(key, key) for key in declared] + [(key, f"{key} (not declared)") for key in retired]

    def queryset(self, request, queryset):
        return queryset.filter(domain=self.value()) if self.value() else queryset


class StageFilter(admin.SimpleListFilter):
    title = "waiting in"
    parameter_name = "stage"
    STAGES = {
        "outbox": ["submitted"],
        "rq": ["queued"],
        "worker": ["running"],
        "finished": ["succeeded", "failed", "outcome_unknown", "cancelled"],
    }

    def lookups(self, request, model_admin):
        return [("outbox", "outbox"), ("rq", "RQ queue"), ("worker", "worker"), ("finished", "finished")]

    def queryset(self, request, queryset):
        if self.value() in self.STAGES:
            return queryset.filter(status__in=self.STAGES[self.value()])
        return queryset


class AgeFilter(admin.SimpleListFilter):
    """Ages from the database clock: the cutoff is clock_timestamp() - interval, computed in SQL."""

    title = "age"
    parameter_name = "older_than"
    CHOICES = {
        "1m": timedelta(minutes=1),
        "5m": timedelta(minutes=5),
        "1h": timedelta(hours=1),
        "1d": timedelta(days=1),
    }
    field = "submitted_at"

    def lookups(self, request, model_admin):
        return [(key, f"older than {key}") for key in self.CHOICES]

    def queryset(self, request, queryset):
        if self.value() in self.CHOICES:
            return queryset.filter(**older_than(self.field, self.CHOICES[self.value()]))
        return queryset


class EnvelopeAgeFilter(AgeFilter):
    field = "created_at"


class FinishedWithinFilter(admin.SimpleListFilter):
    """Jobs that finished recently (the dashboard's failure counts link here), on the database clock."""

    title = "finished"
    parameter_name = "finished_within"
    field = "finished_at"
    CHOICES = {"5m": timedelta(minutes=5), "1h": timedelta(hours=1), "1d": timedelta(days=1)}

    def lookups(self, request, model_admin):
        return [(key, f"in the last {key}") for key in self.CHOICES]

    def queryset(self, request, queryset):
        if self.value() in self.CHOICES:
            cutoff = ExpressionWrapper(
                ClockTimestamp() - Value(self.CHOICES[self.value()], output_field=DurationField()),
                output_field=DateTimeField(),
            )
            return queryset.filter(**{f"{self.field}__gte": cutoff})
        return queryset


class StartedWithinFilter(FinishedWithinFilter):
    """Jobs whose current attempt started recently (the dashboard's "started / min" links here)."""

    title = "started"
    parameter_name = "started_within"
    field = "started_at"


class DueFilter(admin.SimpleListFilter):
    """Envelopes due now (available_at reached, on the database clock) or still waiting for their time."""

    title = "due"
    parameter_name = "due"

    def lookups(self, request, model_admin):
        return [("now", "due now"), ("later", "not yet due")]

    def queryset(self, request, queryset):
        if self.value() == "now":
            return queryset.filter(available_at__lte=ClockTimestamp())
        if self.value() == "later":
            return queryset.filter(available_at__gt=ClockTimestamp())
        return queryset


class RecoveryDecisionFilter(admin.SimpleListFilter):
    """The jobs one recovery round decided one way (the dashboard's recovery counts link here): ``<round>:<kind>``.

    Read from the decisions' events (each names its round); shown in the sidebar only while it is in use.
    """

    title = "recovery round"
    parameter_name = "recovery"
    # The dashboard's count names (views.stats.DECISION_KINDS), in its column order -> the event kind each writes.
    KINDS = COUNT_EVENTS

    def _parsed(self) -> tuple[int, str] | None:
        round_id, _, kind = (self.value() or "").partition(":")
        parsed = parse_id(round_id)
        if parsed is None or kind not in self.KINDS:
            return None
        return parsed, kind

    def lookups(self, request, model_admin):
        parsed = self._parsed()
        if parsed is None:
            return []
        return [(self.value(), f"round {parsed[0]}: {parsed[1].replace('_', ' ')}")]

    def queryset(self, request, queryset):
        parsed = self._parsed()
        if parsed is None:
            return queryset
        round_id, kind = parsed
        decided = JobEvent.objects.filter(kind=self.KINDS[kind], data__round=round_id).values("job_id")
        return queryset.filter(pk__in=decided)


class WorkerFilter(admin.SimpleListFilter):
    """Jobs an RQ worker ran (any attempt, by the attempt history): the dashboard's worker counts link here."""

    title = "worker"
    parameter_name = "worker"

    def lookups(self, request, model_admin):
        return [(self.value(), self.value())] if self.value() else []

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        return queryset.filter(pk__in=JobAttempt.objects.filter(worker=self.value()).values("job_id"))


class ErrorFilter(admin.SimpleListFilter):
    """Jobs whose error starts with a message (the failure alarm's top errors link here; the first line of an
    error is its exception's class and message). Shown in the sidebar only while in use."""

    title = "error"
    parameter_name = "error"

    def lookups(self, request, model_admin):
        return [(self.value(), self.value()[:80])] if self.value() else []

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        return queryset.filter(error__startswith=self.value())
