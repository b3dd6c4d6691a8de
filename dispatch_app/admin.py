"""The operators' admin: jobs, envelopes, a per-job timeline and a per-domain dashboard.

Staff only (the admin site's login), read-only models, and each action behind
its own permission (Meta.permissions on Job and DispatchEnvelope). Actions
change state only through the outbox (dispatch_app.ops.actions); nothing here
pushes to RQ. django-rq's own admin views are re-registered behind the
dedicated ``django_rq.admin`` permission, because they can requeue and delete
RQ jobs directly.
"""

from __future__ import annotations

from datetime import timedelta
from functools import wraps

from django.contrib import admin, messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Value
from django.http import HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from dispatch_app import stages
from dispatch_app.dbtime import ClockTimestamp
from dispatch_app.models import DispatchEnvelope, Job, JobStatus
from dispatch_app.ops import actions, board, timeline
from dispatch_app.ops.chart import domain_charts_svg, throughput_svg
from dispatch_app.ops.timeline import format_duration

DASHBOARD_PERMISSION = "dispatch_app.view_dispatch_dashboard"
PAUSE_PERMISSION = "dispatch_app.pause_domain"
RQ_PERMISSION = "django_rq.admin"
# Bulk retries list every job on the confirmation page; more than this is refused (narrow the filter).
RETRY_CONFIRM_MAX = 5000

# The site index links to the dashboard (the template adds one line above the app list).
admin.site.index_template = "admin/dispatch_app/site_index.html"


def require_perm(request, perm: str, what: str) -> None:
    """A 403 that names the permission missing (templates/403.html shows it)."""
    if not request.user.has_perm(perm):
        raise PermissionDenied(f"{what} needs the permission {perm!r}, which {request.user.get_username()} lacks.")


def _older_than(field: str, delta: timedelta) -> dict:
    cutoff = ExpressionWrapper(
        ClockTimestamp() - Value(delta, output_field=DurationField()), output_field=DateTimeField()
    )
    return {f"{field}__lt": cutoff}


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
            return queryset.filter(**_older_than(self.field, self.CHOICES[self.value()]))
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


def _since(field: str):
    return ExpressionWrapper(ClockTimestamp() - F(field), output_field=DurationField())


def _rq_state(data):
    """The RQ side of a queued or running job: its place in its queue, or whether the worker running it lives."""
    from dispatch_app.domains import REGISTRY
    from dispatch_app.ops import rqside

    job = data.job
    if job.status not in ("submitted", "queued", "running") or job.domain not in REGISTRY:
        return None
    if job.status == "submitted" and job.dispatched_at is None:
        return None  # still in the outbox: nothing in Redis yet
    state = rqside.job_state(job.pk, job.attempt, REGISTRY[job.domain].queue)
    if job.status == "running" and not state.worker and not state.error:
        # No RQ hash names a worker: fall back on the one the attempt's start recorded.
        recorded = next((v.attempt.worker for v in getattr(data, "attempts", []) if v.current), "")
        if recorded:
            info = rqside.read_workers(rqside.redis_conn(), [recorded])[recorded]
            state.worker, state.worker_alive, state.worker_dead_reason = recorded, info.alive, info.dead_reason
            state.last_heartbeat = info.last_heartbeat
    dead_for = None
    if state.worker_alive is False and state.last_heartbeat is not None:
        dead_for = max((data.now - state.last_heartbeat).total_seconds(), 0.0)
    return {**state.__dict__, "dead_for": dead_for}


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows change only through the outbox actions below, never through a form."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _refuse_unless_viewable(self, request, obj=None) -> None:
        if not self.has_view_or_change_permission(request, obj):
            opts = self.model._meta
            raise PermissionDenied(
                f"The {opts.verbose_name_plural} pages need the permission '{opts.app_label}.view_{opts.model_name}', "
                f"which {request.user.get_username()} lacks."
            )

    def changelist_view(self, request, extra_context=None):
        self._refuse_unless_viewable(request)
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        self._refuse_unless_viewable(request)
        return super().change_view(request, object_id, form_url, extra_context)


def _report(modeladmin, request, outcomes) -> None:
    applied = [o for o in outcomes if o.applied]
    refused = [o for o in outcomes if not o.applied]
    if applied:
        modeladmin.message_user(request, "; ".join(o.message for o in applied[:10]), messages.SUCCESS)
    if refused:
        modeladmin.message_user(request, "; ".join(o.message for o in refused[:10]), messages.WARNING)


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
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
        "timeline_link",
    )
    list_filter = ("domain", "status", StageFilter, AgeFilter, FinishedWithinFilter)
    search_fields = ("=id", "vendor_request_id")
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False  # no count(*) over a big table on each page
    actions = ["retry_now", "cancel"]
    change_list_template = "admin/dispatch_app/job/change_list.html"
    readonly_fields = [f.name for f in Job._meta.fields]

    def get_queryset(self, request):
        # The stage columns are the current attempt's (dispatch_app.stages), fetched with the page.
        return stages.annotate_current(super().get_queryset(request).annotate(_age=_since("submitted_at")))

    def get_search_results(self, request, queryset, search_term):
        # A number is a job id, exactly: "5" finds job 5, not every vendor request id containing a 5.
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        return super().get_search_results(request, queryset, search_term)

    def _stage(self, obj, key: str) -> str:
        if not hasattr(obj, "_now"):
            return "–"
        stage = stages.current_attempt(obj).stage(key, obj._now)
        if stage is None or stage.duration is None:
            return "–"
        return format_duration(stage.duration) + (" so far" if stage.ongoing else "")

    @admin.display(description="waiting in")
    def waiting_in(self, obj):
        if not hasattr(obj, "_now"):
            return timeline.waiting_stage(obj.status)
        key = stages.current_attempt(obj).waiting_in(obj._now)
        return stages.SHORT.get(key, key)

    @admin.display(description="age", ordering="submitted_at")
    def age(self, obj):
        return format_duration(getattr(obj, "_age", None))

    @admin.display(description="backoff")
    def backoff_wait(self, obj):
        return self._stage(obj, "backoff")

    @admin.display(description="outbox")
    def outbox_wait(self, obj):
        return self._stage(obj, "outbox")

    @admin.display(description="RQ queue")
    def queue_wait(self, obj):
        return self._stage(obj, "rq")

    @admin.display(description="worker")
    def run_time(self, obj):
        return self._stage(obj, "worker")

    @admin.display(description="timeline")
    def timeline_link(self, obj):
        return format_html('<a href="{}">timeline</a>', reverse("admin:dispatch_app_job_timeline", args=[obj.pk]))

    def has_retry_permission(self, request):
        return request.user.has_perm("dispatch_app.retry_job")

    def has_cancel_permission(self, request):
        return request.user.has_perm("dispatch_app.cancel_job")

    @admin.action(description="Retry now (through the outbox; failed and outcome_unknown too)", permissions=["retry"])
    def retry_now(self, request, queryset):
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[: RETRY_CONFIRM_MAX + 1])
        if len(ids) > RETRY_CONFIRM_MAX:
            self.message_user(
                request, f"More than {RETRY_CONFIRM_MAX} jobs selected; narrow the filter.", messages.ERROR
            )
            return None
        if request.POST.get("confirmed") != "yes":
            # An intermediate page first: per domain, whether re-running is safe and which vendor requests
            # are in doubt. Nothing changes until the operator confirms.
            context = {
                **self.admin_site.each_context(request),
                "title": "Retry these jobs?",
                "opts": self.model._meta,
                "plans": actions.retry_plan(ids),
                "ids": ids,
                "action": "retry_now",
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(request, "admin/dispatch_app/job/retry_confirm.html", context)
        _report(self, request, [actions.retry_job_now(pk, user=request.user) for pk in ids])
        return None

    @admin.action(description="Cancel the selected jobs", permissions=["cancel"])
    def cancel(self, request, queryset):
        _report(
            self, request, [actions.cancel_job(pk, user=request.user) for pk in queryset.values_list("pk", flat=True)]
        )

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

    def timeline_view(self, request, job_id: int):
        if not self.has_view_permission(request):
            raise PermissionDenied(
                f"A job's timeline needs the permission 'dispatch_app.view_job', "
                f"which {request.user.get_username()} lacks."
            )
        try:
            data = timeline.build(job_id)
        except Job.DoesNotExist:
            from django.http import Http404

            raise Http404(f"job {job_id} does not exist") from None
        context = {
            **self.admin_site.each_context(request),
            "title": f"Timeline of {data.job}",
            "opts": self.model._meta,
            "timeline": data,
            "entries": [(e, format_duration(e.until_next)) for e in data.entries],
            "stages": [(s, format_duration(s.duration)) for s in data.stages],
            "rq_state": _rq_state(data),
        }
        return TemplateResponse(request, "admin/dispatch_app/timeline.html", context)

    def _dashboard_context(self, request) -> dict:
        require_perm(request, DASHBOARD_PERMISSION, "The dispatch dashboard")
        data = board.build()
        rows = [
            {"domain": domain, **d, "charts": domain_charts_svg(d.get("chart", []), domain)}
            for domain, d in data["domains"].items()
        ]
        return {
            **self.admin_site.each_context(request),
            "title": "Dispatch dashboard",
            "opts": self.model._meta,
            "snap": data,
            "rows": rows,
            "statuses": [JobStatus.SUBMITTED, JobStatus.QUEUED, JobStatus.RUNNING],
            "chart": throughput_svg(data["throughput"]),
            "can_pause": request.user.has_perm(PAUSE_PERMISSION),
            "jobs_url": reverse("admin:dispatch_app_job_changelist"),
            "envelopes_url": reverse("admin:dispatch_app_dispatchenvelope_changelist"),
            "refresh_seconds": 5,
        }

    def dashboard_view(self, request):
        return TemplateResponse(request, "admin/dispatch_app/dashboard.html", self._dashboard_context(request))

    def dashboard_fragment_view(self, request):
        """The live part alone: the page's script swaps it in every few seconds (admin_view: never cached)."""
        return TemplateResponse(request, "admin/dispatch_app/dashboard_live.html", self._dashboard_context(request))

    def dashboard_json_view(self, request):
        require_perm(request, DASHBOARD_PERMISSION, "The dispatch dashboard")
        data = board.build()
        for d in data["domains"].values():
            d.pop("chart", None)
        return JsonResponse(data, json_dumps_params={"default": str, "sort_keys": True})

    def pause_view(self, request):
        require_perm(request, PAUSE_PERMISSION, "Pausing or resuming dispatch")
        domain, op = request.POST.get("domain", ""), request.POST.get("op", "")
        try:
            if op == "pause":
                outcome = actions.pause_domain(domain, user=request.user, reason=request.POST.get("reason", ""))
            elif op == "resume":
                outcome = actions.resume_domain(domain, user=request.user)
            else:
                raise ValueError(f"op must be 'pause' or 'resume', got {op!r}")
        except ValueError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(request, outcome.message, messages.SUCCESS if outcome.applied else messages.WARNING)
        return HttpResponseRedirect(reverse("admin:dispatch_app_dashboard"))

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "can_see_dashboard": request.user.has_perm(DASHBOARD_PERMISSION)}
        return super().changelist_view(request, extra_context)


@admin.register(DispatchEnvelope)
class EnvelopeAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "job_link",
        "attempt",
        "domain",
        "queue",
        "status",
        "available_at",
        "age",
        "send_attempts",
        "short_error",
    )
    list_filter = ("status", "domain", EnvelopeAgeFilter)
    search_fields = ("=id", "=job__id")
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False
    actions = ["retry_now", "rearm"]
    readonly_fields = [f.name for f in DispatchEnvelope._meta.fields]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_age=_since("created_at"))

    @admin.display(description="job", ordering="job_id")
    def job_link(self, obj):
        return format_html(
            '<a href="{}">job {}</a>', reverse("admin:dispatch_app_job_timeline", args=[obj.job_id]), obj.job_id
        )

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
        _report(self, request, [actions.retry_envelope_now(pk, user=request.user) for pk in ids])

    @admin.action(description="Re-arm dead envelopes (back to the outbox)", permissions=["rearm"])
    def rearm(self, request, queryset):
        ids = queryset.values_list("pk", flat=True)
        _report(self, request, [actions.rearm_envelope(pk, user=request.user) for pk in ids])


# --- django-rq: its admin views can requeue/delete RQ jobs directly, so only a dedicated permission sees them.
def _restrict_rq_admin() -> None:
    try:
        from django_rq.admin import QueueAdmin
        from django_rq.models import Dashboard
    except ImportError:  # django-rq not installed: nothing mounted
        return

    def allowed(request) -> bool:
        user = request.user
        return user.is_active and user.is_staff and user.has_perm(RQ_PERMISSION)

    def guard(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not (request.user.is_active and request.user.is_staff):
                return redirect_to_login(request.get_full_path(), reverse("admin:login"))
            if not allowed(request):
                raise PermissionDenied(f"django-rq's views need the permission {RQ_PERMISSION!r}.")
            return view(request, *args, **kwargs)

        return wrapper

    class RestrictedQueueAdmin(QueueAdmin):
        def has_module_permission(self, request):
            return allowed(request)

        def has_view_permission(self, request, obj=None):
            return allowed(request)

        def has_change_permission(self, request, obj=None):
            return allowed(request)

        def changelist_view(self, request, extra_context=None):
            if not allowed(request):
                raise PermissionDenied(f"django-rq's views need the permission {RQ_PERMISSION!r}.")
            return super().changelist_view(request, extra_context)

        def get_urls(self):
            urls = super().get_urls()
            for pattern in urls:
                pattern.callback = guard(pattern.callback)
            return urls

    if admin.site.is_registered(Dashboard):
        admin.site.unregister(Dashboard)
    admin.site.register(Dashboard, RestrictedQueueAdmin)


_restrict_rq_admin()
