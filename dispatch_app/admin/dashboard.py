"""The dispatch dashboard's views (mixed into JobAdmin, under its URLs): the page, its live fragment, JSON, pause."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from dispatch_app.admin.common import DASHBOARD_PERMISSION, PAUSE_PERMISSION, require_perm
from dispatch_app.models import JobStatus
from dispatch_app.ops import actions, board
from dispatch_app.ops.chart import domain_charts_svg, throughput_svg


class DashboardViews:
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
