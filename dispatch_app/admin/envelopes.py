"""The envelope list: the outbox rows with their due time, send attempts and last error; make due, re-arm."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

import dispatch_app.actions.operator as actions
import dispatch_app.views.blockers as blockers
from dispatch_app.admin.common import ReadOnlyAdmin, report, since, until
from dispatch_app.admin.filters import DomainFilter, DueFilter, EnvelopeAgeFilter
from dispatch_app.models import DispatchEnvelope
from dispatch_app.store.api import WRITER_TOKEN
from dispatch_app.templatetags.dispatch_ops import utc
from dispatch_app.views.timeline import format_duration


@admin.register(DispatchEnvelope)
class EnvelopeAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "job_link",
        "attempt",
        "domain",
        "queue",
        "status",
        "available",
        "age",
        "send_attempts",
        "short_error",
    )
    list_filter = ("status", DomainFilter, DueFilter, EnvelopeAgeFilter)
    search_fields = ("=id", "=job__id")
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False
    actions = ["retry_now", "rearm"]
    readonly_fields = [f.name for f in DispatchEnvelope._meta.fields]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_age=since("created_at"), _due_in=until("available_at"))

    @admin.display(description="job", ordering="job_id")
    def job_link(self, obj):
        return format_html(
            '<a href="{}">job {}</a>', reverse("admin:dispatch_app_job_timeline", args=[obj.job_id]), obj.job_id
        )

    @admin.display(description="available at (pending) / sent (dispatched)", ordering="available_at")
    def available(self, obj):
        # A dispatched envelope's available_at is its last lease's end, not a due time: show when it was sent.
        if obj.status == "dispatched":
            return f"sent {utc(obj.dispatched_at)}"
        due_in = getattr(obj, "_due_in", None)
        relative = f" ({blockers.in_seconds(due_in.total_seconds())})" if due_in is not None else ""
        if obj.lease_token == WRITER_TOKEN:
            leased = "sent by its writer, due "  # SUBMIT_SENDS: the dispatcher takes it after SUBMIT_SEND_GRACE
        else:
            leased = "leased until " if obj.lease_token else ""
        return f"{leased}{utc(obj.available_at)}{relative}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj):
        return format_duration(getattr(obj, "_age", None))

    @admin.display(description="last error")
    def short_error(self, obj):
        return (obj.last_error[:120] + "…") if len(obj.last_error) > 120 else obj.last_error

    def has_retry_permission(self, request):
        return request.user.has_perm("dispatch_app.retry_envelope")

    def has_rearm_permission(self, request):
        return request.user.has_perm("dispatch_app.rearm_envelope")

    @admin.action(description="Make due now (pending envelopes)", permissions=["retry"])
    def retry_now(self, request, queryset):
        ids = queryset.values_list("pk", flat=True)
        report(self, request, [actions.retry_envelope_now(pk, user=request.user) for pk in ids])

    @admin.action(description="Re-arm dead envelopes (back to the outbox)", permissions=["rearm"])
    def rearm(self, request, queryset):
        ids = queryset.values_list("pk", flat=True)
        report(self, request, [actions.rearm_envelope(pk, user=request.user) for pk in ids])
