"""The operators' admin: jobs, envelopes, a per-job timeline and a per-domain dashboard.

Staff only (the admin site's login), read-only models, and each action behind
its own permission (Meta.permissions on Job and DispatchEnvelope). Actions
change state only through the outbox (dispatch_app.actions.operator); nothing here
pushes to RQ. django-rq's own admin views are not mounted at all: they read
RQ job hashes with pickle (``rq_views``).

Modules: ``common`` (permissions, read-only base), ``filters``, ``jobs`` (the
job list and its actions), ``timeline`` and ``dashboard`` (views mounted under
the job admin's URLs), ``envelopes``, ``rq_views`` (unmounts django-rq's
views).
"""

from django.contrib import admin

from dispatch_app.admin.common import DASHBOARD_PERMISSION, PAUSE_PERMISSION, require_perm
from dispatch_app.admin.envelopes import EnvelopeAdmin
from dispatch_app.admin.jobs import RETRY_CONFIRM_MAX, JobAdmin
from dispatch_app.admin.rq_views import unmount_rq_admin

# The site index links to the dashboard (the template adds one line above the app list).
admin.site.index_template = "admin/dispatch_app/site_index.html"

unmount_rq_admin()

__all__ = [
    "DASHBOARD_PERMISSION",
    "PAUSE_PERMISSION",
    "RETRY_CONFIRM_MAX",
    "EnvelopeAdmin",
    "JobAdmin",
    "require_perm",
]
