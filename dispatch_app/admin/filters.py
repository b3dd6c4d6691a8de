"""The job and envelope lists' filters; every age is cut on the database clock (clock_timestamp() - interval)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, Value

from dispatch_app.admin.common import older_than
from dispatch_app.dbtime import ClockTimestamp


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
    CHOICES = {"5m": timedelta(minutes=5), "1h": timedelta(hours=1), "1d": timedelta(days=1)}

    def lookups(self, request, model_admin):
        return [(key, f"in the last {key}") for key in self.CHOICES]

    def queryset(self, request, queryset):
        if self.value() in self.CHOICES:
            cutoff = ExpressionWrapper(
                ClockTimestamp() - Value(self.CHOICES[self.value()], output_field=DurationField()),
                output_field=DateTimeField(),
            )
            return queryset.filter(finished_at__gte=cutoff)
        return queryset
