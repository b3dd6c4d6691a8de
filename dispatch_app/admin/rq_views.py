"""django-rq's admin views can requeue and delete RQ jobs directly, so only a dedicated permission sees them."""

from __future__ import annotations

from functools import wraps

from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.urls import reverse

from dispatch_app.admin.common import RQ_PERMISSION


def restrict_rq_admin() -> None:
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
