"""What every operator page shares: permissions named in 403s, read-only model admins, action reports, SQL ages."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Value
from django.http import HttpResponseRedirect

import dispatch_app.admin.untrusted as untrusted
from dispatch_app.db.clock import ClockTimestamp

DASHBOARD_PERMISSION = "dispatch_app.view_dispatch_dashboard"
PAUSE_PERMISSION = "dispatch_app.pause_domain"


def require_perm(request, perm: str, what: str) -> None:
    """A 403 that names the permission missing (templates/403.html shows it)."""
    if not request.user.has_perm(perm):
        raise PermissionDenied(f"{what} needs the permission {perm!r}, which {request.user.get_username()} lacks.")


def older_than(field: str, delta: timedelta) -> dict:
    cutoff = ExpressionWrapper(
        ClockTimestamp() - Value(delta, output_field=DurationField()), output_field=DateTimeField()
    )
    return {f"{field}__lt": cutoff}


def since(field: str):
    return ExpressionWrapper(ClockTimestamp() - F(field), output_field=DurationField())


def until(field: str):
    """How far ahead of the database clock an instant is (negative: behind)."""
    return ExpressionWrapper(F(field) - ClockTimestamp(), output_field=DurationField())


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows change only through the outbox actions, never through a form."""

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
        refused = refuse_untrusted(request)
        if refused:
            # Back to the bare list, the reason shown on it; nothing was read or written with the bad input.
            self.message_user(request, refused, messages.ERROR)
            return HttpResponseRedirect(request.path)
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        self._refuse_unless_viewable(request)
        return super().change_view(request, object_id, form_url, extra_context)


def refuse_untrusted(request) -> str | None:
    """Why a list request is refused (a NUL anywhere, a selected row that is not an id), or None."""
    bad = untrusted.nul_parameter(request.GET, request.POST)
    if bad is not None:
        return f"The parameter {bad!r} contains a NUL character; it was refused and nothing was done."
    if request.method == "POST" and "action" in request.POST:
        selected = request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)
        if untrusted.parse_ids(selected) is None:
            return "A selected row is not a valid id; nothing was done."
    return None


REPORT_LINES = 5  # outcomes spelled out per message; beyond that, a count and the rest in the audit trail


def summarise(outcomes, verb: str) -> str:
    """One line for many outcomes: the first few in full, then how many more (a bulk retry of 296 jobs is
    one readable message, not 296 ids; each job's own event on its timeline keeps the detail)."""
    shown = "; ".join(o.message for o in outcomes[:REPORT_LINES])
    if len(outcomes) <= REPORT_LINES:
        return shown
    return f"{len(outcomes)} {verb}: {shown}; … and {len(outcomes) - REPORT_LINES} more"


def report(modeladmin, request, outcomes) -> None:
    applied = [o for o in outcomes if o.applied]
    refused = [o for o in outcomes if not o.applied]
    if applied:
        modeladmin.message_user(request, summarise(applied, "done"), messages.SUCCESS)
    if refused:
        modeladmin.message_user(request, summarise(refused, "refused"), messages.WARNING)
