"""The dispatch dashboard's views (mixed into JobAdmin, under its URLs): the page, its live fragment, JSON, pause."""

from __future__ import annotations

from django.contrib import messages
from django.db import connection
from django.http import HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse

import dispatch_app.actions.operator as actions
import dispatch_app.admin.untrusted as untrusted
import dispatch_app.views.board as board
from dispatch_app.admin.common import DASHBOARD_PERMISSION, PAUSE_PERMISSION, require_perm
from dispatch_app.domains import domain_keys
from dispatch_app.models import JobStatus
from dispatch_app.views.chart import domain_charts_svg, throughput_svg


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
        """Pause or resume, in two steps: the dashboard's button opens a page naming the domain and what the change
        does; only its form, with a reason (required: the audit says why), changes anything."""
        require_perm(request, PAUSE_PERMISSION, "Pausing or resuming dispatch")
        back = HttpResponseRedirect(reverse("admin:dispatch_app_dashboard"))
        domain, op = request.POST.get("domain", ""), request.POST.get("op", "")
        reason = request.POST.get("reason", "").strip()
        refused = untrusted.nul_parameter(request.POST)
        if refused is None and op not in ("pause", "resume"):
            refused = f"op must be 'pause' or 'resume', got {op!r}"
        elif refused is not None:
            refused = f"The parameter {refused!r} contains a NUL character; it was refused and nothing was done."
        elif domain not in domain_keys():
            refused = f"unknown domain {domain!r}; valid domains: {', '.join(domain_keys())}"
        if refused:
            self.message_user(request, refused, messages.ERROR)
            return back
        if request.POST.get("confirmed") != "yes" or not reason:
            error = "A reason is required." if request.POST.get("confirmed") == "yes" else ""
            return self._pause_confirm(request, domain, op, reason, error)
        if op == "pause":
            outcome = actions.pause_domain(domain, user=request.user, reason=reason)
        else:
            outcome = actions.resume_domain(domain, user=request.user, reason=reason)
        self.message_user(request, outcome.message, messages.SUCCESS if outcome.applied else messages.WARNING)
        return back

    def _pause_confirm(self, request, domain: str, op: str, reason: str, error: str):
        context = {
            **self.admin_site.each_context(request),
            "title": f"{op.capitalize()} dispatch of {domain}?",
            "opts": self.model._meta,
            "plan": pause_plan(domain),
            "domain": domain,
            "op": op,
            "reason": reason,
            "error": error,
        }
        return TemplateResponse(request, "admin/dispatch_app/pause_confirm.html", context)


def pause_plan(domain: str) -> dict:
    """What a pause or resume of ``domain`` touches, read when the confirmation page is shown."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE status = 'pending'), "
            "count(*) FILTER (WHERE status = 'pending' AND available_at <= clock_timestamp()) "
            "FROM dispatch_app_dispatchenvelope WHERE domain = %s",
            [domain],
        )
        pending, due = cursor.fetchone()
        paused = actions.paused_domains(cursor).get(domain)
    return {"pending": pending, "due": due, "paused": paused}
