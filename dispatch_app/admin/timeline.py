"""A job's timeline page (mixed into JobAdmin): every attempt's stages and events, and the RQ side live."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import Http404
from django.template.response import TemplateResponse

import dispatch_app.actions.operator as actions
import dispatch_app.rq.state.jobs as rqjobs
import dispatch_app.views.blockers as blockers
import dispatch_app.views.stats as stats
import dispatch_app.views.timeline as timeline
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.models import Job
from dispatch_app.views.timeline import format_duration


def rq_state(data):
    """The RQ side of a queued or running job: its place in its queue, or whether the worker running it lives
    (a dispatched job still marked submitted is looked up too: the marker may lag the send)."""
    job = data.job
    if job.status == "submitted" and job.dispatched_at is None:
        return None  # still in the outbox: nothing in Redis yet
    state = rqjobs.states([job], statuses=("submitted", "queued", "running")).get(job.pk)
    if state is None:
        return None
    dead_for = None
    if state.worker_alive is False and state.last_heartbeat is not None:
        dead_for = max((data.now - state.last_heartbeat).total_seconds(), 0.0)
    return {**state.__dict__, "dead_for": dead_for}


def outbox_blocker(job) -> blockers.Blocker:
    """What holds a job that has not reached RQ (the list's wording)."""
    if job.status != "submitted":
        return blockers.Blocker("none", "")
    with connection.cursor() as cursor:
        envelope = blockers.envelopes_of(cursor, [job.pk]).get(job.pk)
        pause = actions.paused_domains(cursor).get(job.domain)
        alive = blockers.live_dispatcher(stats.dispatchers(cursor, dispatch_settings().HEARTBEAT_STALE_SECONDS))
    return blockers.outbox(job.status, job.attempt, envelope, pause, alive)


class TimelineViews:
    def timeline_view(self, request, job_id: int):
        if not self.has_view_permission(request):
            raise PermissionDenied(
                f"A job's timeline needs the permission 'dispatch_app.view_job', "
                f"which {request.user.get_username()} lacks."
            )
        try:
            data = timeline.build(job_id)
        except Job.DoesNotExist:
            raise Http404(f"job {job_id} does not exist") from None
        state = rq_state(data)
        if state and data.job.status == "running" and state.get("worker") and not state.get("worker_alive"):
            updated = (data.now - data.job.updated_at).total_seconds()
            state["recovery_eta"] = blockers.recovery_eta_for(data.job.domain, updated)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Timeline of {data.job}",
            "blocker": outbox_blocker(data.job),
            "envelope_due": {
                env.pk: blockers.in_seconds((env.available_at - data.now).total_seconds()) for env in data.envelopes
            },
            "can_retry": request.user.has_perm("dispatch_app.retry_job"),
            "can_cancel": request.user.has_perm("dispatch_app.cancel_job"),
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "opts": self.model._meta,
            "timeline": data,
            "entries": [(e, format_duration(e.until_next)) for e in data.entries],
            "stages": [(s, format_duration(s.duration)) for s in data.stages],
            "rq_state": state,
        }
        return TemplateResponse(request, "admin/dispatch_app/timeline.html", context)
