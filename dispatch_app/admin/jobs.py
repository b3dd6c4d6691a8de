"""The job list: the stage each job waits in, per-stage times of its current attempt, retry and cancel."""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.db import connection
from django.db.models import F, IntegerField
from django.db.models.expressions import RawSQL
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator
from django.views.decorators.http import require_POST

import dispatch_app.actions.operator as actions
import dispatch_app.rq.state.jobs as rqjobs
import dispatch_app.rq.state.order as queue_order
import dispatch_app.timeline.stages as stages
import dispatch_app.views.blockers as blockers
import dispatch_app.views.confirm_warnings as confirm_warnings
import dispatch_app.views.stats as stats
import dispatch_app.views.timeline as timeline
from dispatch_app.admin.common import DASHBOARD_PERMISSION, ReadOnlyAdmin, report, since
from dispatch_app.admin.dashboard import DashboardViews
from dispatch_app.admin.filters import (
    AgeFilter,
    DomainFilter,
    ErrorFilter,
    FinishedWithinFilter,
    RecoveryDecisionFilter,
    StageFilter,
    StartedWithinFilter,
    WorkerFilter,
)
from dispatch_app.admin.timeline import TimelineViews
from dispatch_app.admin.untrusted import parse_id, parse_ids
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.models import Job
from dispatch_app.templatetags.dispatch_ops import utc
from dispatch_app.views.timeline import format_duration

# Bulk retries list every job on the confirmation page; more than this is refused (narrow the filter).
RETRY_CONFIRM_MAX = 5000


def _in_line(request) -> bool:
    """The list shows jobs waiting in RQ: sort them by their place in line."""
    return request.GET.get("stage") == "rq" or request.GET.get("status__exact") == "queued"


def _queue_position(request) -> RawSQL:
    """SQL: the job's current attempt's place in line, read from Redis once per request (NULL: none found).

    A jsonb object lookup (a binary search over its keys) per row, not an array scan: the order is up to
    ``tuning.RQ_LIST_READ_MAX`` ids per lane."""
    if not hasattr(request, "_pf_queue_positions"):
        domain = request.GET.get("domain__exact")
        request._pf_queue_positions = queue_order.positions([domain] if domain else None)[0]
    return RawSQL(
        "(%s::jsonb ->> (dispatch_app_job.id::text || '-' || dispatch_app_job.attempt::text))::int",
        [json.dumps(request._pf_queue_positions)],
        output_field=IntegerField(),
    )


@admin.register(Job)
class JobAdmin(DashboardViews, TimelineViews, ReadOnlyAdmin):
    list_display = (
        "id",
        "domain",
        "status",
        "waiting_in",
        "attempt",
        "age",
        "backoff_wait",
        "outbox_wait",
        "queue_wait",
        "run_time",
        "rq_side",
        "short_error",
        "timeline_link",
    )
    list_filter = (
        DomainFilter,
        "status",
        StageFilter,
        AgeFilter,
        StartedWithinFilter,
        FinishedWithinFilter,
        RecoveryDecisionFilter,
        WorkerFilter,
        ErrorFilter,
    )
    search_fields = ("=id", "vendor_request_id")
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False  # no count(*) over a big table on each page
    actions = ["retry_now", "cancel"]
    change_list_template = "admin/dispatch_app/job/change_list.html"
    readonly_fields = [f.name for f in Job._meta.fields]

    def get_queryset(self, request):
        # The stage columns are the current attempt's (dispatch_app.timeline.stages), fetched with the page.
        qs = super().get_queryset(request).annotate(_age=since("submitted_at"), _updated=since("updated_at"))
        qs = stages.annotate_current(qs)
        if _in_line(request):
            qs = qs.annotate(_queue_pos=_queue_position(request))
        return qs

    def get_ordering(self, request):
        # Jobs waiting in RQ: in the order workers will take them (rq.state.order: the new lane, then the
        # recovery lane, each from its head), so "who is next" is on page 1; jobs with no place read in Redis
        # (prefetched, too far back, unreadable) after them by dispatch time. Elsewhere newest first.
        if _in_line(request):
            return (F("_queue_pos").asc(nulls_last=True), "dispatched_at", "id")
        return super().get_ordering(request)

    def get_search_results(self, request, queryset, search_term):
        # A number is a job id, exactly: "5" finds job 5, not every vendor request id containing a 5.
        job_id = parse_id(search_term.strip().lstrip("#"))
        if job_id is not None:
            return queryset.filter(pk=job_id), False
        return super().get_search_results(request, queryset, search_term)

    def _stage(self, obj, key: str) -> str:
        if not hasattr(obj, "_now"):
            return "–"
        stage = stages.current_attempt(obj).stage(key, obj._now)
        if stage is None or stage.duration is None:
            return "–"
        return format_duration(stage.duration) + (" so far" if stage.ongoing else "")

    @admin.display(description="waiting in: behind what")
    def waiting_in(self, obj):
        if not hasattr(obj, "_now"):
            where = timeline.waiting_stage(obj.status)
        else:
            key = stages.current_attempt(obj).waiting_in(obj._now)
            where = stages.SHORT.get(key, key)
        blocker = getattr(obj, "_blocker", None)
        if blocker is None or not blocker.text:
            return where
        if blocker.alarming:
            return format_html('{}: <span class="pf-blocker pf-red">{}</span>', where, blocker.text)
        return format_html('{}: <span class="pf-blocker">{}</span>', where, blocker.text)

    @admin.display(description="age (since submit)", ordering="submitted_at")
    def age(self, obj):
        return format_duration(getattr(obj, "_age", None))

    @admin.display(description="backoff (created → due)")
    def backoff_wait(self, obj):
        return self._stage(obj, "backoff")

    @admin.display(description="outbox (due → dispatched)")
    def outbox_wait(self, obj):
        return self._stage(obj, "outbox")

    @admin.display(description="RQ queue (dispatched → started)")
    def queue_wait(self, obj):
        return self._stage(obj, "rq")

    @admin.display(description="worker (started → finished)")
    def run_time(self, obj):
        return self._stage(obj, "worker")

    @admin.display(description="RQ side")
    def rq_side(self, obj):
        state = getattr(obj, "_rq", None)
        text, alarming = rqjobs.describe(obj.status, state, fmt_instant=utc)
        if alarming and obj.status == "running" and state is not None and not state.error:
            # A dead worker holds it: say when recovery acts, with the setting that decides.
            updated = getattr(obj, "_updated", None)
            text += "; " + blockers.recovery_eta_for(obj.domain, updated.total_seconds() if updated else None)
        return format_html('<span class="pf-rq-side pf-red">{}</span>', text) if alarming else text

    def get_changelist_instance(self, request):
        # The page's queued and running jobs are looked up in Redis together (rqjobs: a few round trips per
        # server), once; the rows the template renders are these same instances (the page's queryset cache).
        changelist = super().get_changelist_instance(request)
        page = list(changelist.result_list)
        found = rqjobs.states(page)
        for job in page:
            job._rq = found.get(job.pk)
        # The outbox side, for the page's jobs not in RQ yet: their envelope, the pause, a live dispatcher.
        waiting = [job for job in page if job.status == "submitted"]
        if waiting:
            with connection.cursor() as cursor:
                envelopes = blockers.envelopes_of(cursor, [job.pk for job in waiting])
                paused = actions.paused_domains(cursor)
                alive = blockers.live_dispatcher(stats.dispatchers(cursor, dispatch_settings().HEARTBEAT_STALE_SECONDS))
            for job in waiting:
                job._blocker = blockers.outbox(
                    job.status, job.attempt, envelopes.get(job.pk), paused.get(job.domain), alive
                )
        return changelist

    @admin.display(description="last error")
    def short_error(self, obj):
        """The error's first line (exception class and message), cut: the timeline has the rest."""
        first = (obj.error or "").split("\n", 1)[0]
        if not first:
            return "–"
        return format_html('<span class="pf-error" title="{}">{}</span>', first, Truncator(first).chars(90))

    @admin.display(description="timeline")
    def timeline_link(self, obj):
        return format_html('<a href="{}">timeline</a>', reverse("admin:dispatch_app_job_timeline", args=[obj.pk]))

    def has_retry_permission(self, request):
        return request.user.has_perm("dispatch_app.retry_job")

    def has_cancel_permission(self, request):
        return request.user.has_perm("dispatch_app.cancel_job")

    def _selected_ids(self, request, queryset) -> tuple[bool, list[int] | None]:
        """(confirmed?, the job ids the action is about), or ids None after a message (too many).

        Confirmed: exactly the jobs the confirmation page listed (its hidden fields). The confirming POST goes to
        the filtered list's URL and may carry select_across=1, so ``queryset`` is that filter applied again: a
        job that joined it meanwhile was never shown, one that left it (the failures link's finished_within=5m)
        was. Each listed job is re-checked under lock by the action itself."""
        if request.POST.get("confirmed") == "yes":
            return True, parse_ids(request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)) or []
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[: RETRY_CONFIRM_MAX + 1])
        if len(ids) > RETRY_CONFIRM_MAX:
            self.message_user(
                request, f"More than {RETRY_CONFIRM_MAX} jobs selected; narrow the filter.", messages.ERROR
            )
            return False, None
        return False, ids

    def _confirm_page(self, request, template: str, title: str, action: str, ids: list[int], **extra):
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.model._meta,
            "ids": ids,
            "action": action,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            **extra,
        }
        return TemplateResponse(request, template, context)

    @admin.action(description="Retry now (through the outbox; failed and outcome_unknown too)", permissions=["retry"])
    def retry_now(self, request, queryset):
        confirmed, ids = self._selected_ids(request, queryset)
        if ids is None:
            return None
        if not confirmed:
            # An intermediate page first: per domain, whether re-running is safe and which vendor requests
            # are in doubt. Nothing changes until the operator confirms.
            return self._confirm_page(
                request,
                "admin/dispatch_app/job/retry_confirm.html",
                "Retry these jobs?",
                "retry_now",
                ids,
                plans=(plans := actions.retry_plan(ids)),
                warnings=confirm_warnings.retry_warnings(plans, ids),
            )
        report(self, request, [actions.retry_job_now(pk, user=request.user) for pk in ids])
        return None

    @admin.action(description="Cancel the selected jobs (asks for a reason first)", permissions=["cancel"])
    def cancel(self, request, queryset):
        confirmed, ids = self._selected_ids(request, queryset)
        if ids is None:
            return None
        reason = request.POST.get("reason", "").strip()
        if not confirmed or not reason:
            # Every job listed by id, domain and status; the reason goes on each job's event and the admin log.
            jobs = list(Job.objects.filter(pk__in=ids).order_by("pk").values_list("pk", "domain", "status"))
            return self._confirm_page(
                request,
                "admin/dispatch_app/job/cancel_confirm.html",
                "Cancel these jobs?",
                "cancel",
                [pk for pk, _, _ in jobs],
                jobs=jobs,
                finished=[j for j in jobs if j[2] not in timeline.STAGE_BY_STATUS],
                reason=reason,
                error="A reason is required." if confirmed else "",
            )
        report(self, request, [actions.cancel_job(pk, user=request.user, reason=reason) for pk in ids])
        return None

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("dashboard/", view(self.dashboard_view), name="dispatch_app_dashboard"),
            path("dashboard/live/", view(self.dashboard_fragment_view), name="dispatch_app_dashboard_live"),
            path("dashboard/data.json", view(self.dashboard_json_view), name="dispatch_app_dashboard_json"),
            path("dashboard/pause/", view(require_POST(self.pause_view)), name="dispatch_app_dashboard_pause"),
            path("<int:job_id>/timeline/", view(self.timeline_view), name="dispatch_app_job_timeline"),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "can_see_dashboard": request.user.has_perm(DASHBOARD_PERMISSION)}
        return super().changelist_view(request, extra_context)
