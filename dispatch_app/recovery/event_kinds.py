"""The event kinds a recovery round writes to a job's history, a leaf the admin and the job list read too.

Kept apart from ``recovery.actions`` so a page that only names the kinds does not load the round's machinery
(Redis client, evidence, the store's writes) with it.
"""

from __future__ import annotations

import dispatch_app.recovery.decide as decisions

# The history's event kinds; a re-dispatch is recorded by transitions.redispatch with the same reason.
EVENT_KINDS = {
    decisions.REDISPATCH: "recovery_redispatch",
    decisions.LEAVE_ALONE: "recovery_leave_alone",
    decisions.OUTCOME_UNKNOWN: "recovery_outcome_unknown",
    decisions.FAIL: "recovery_fail",
}
# A candidate the round could not decide on (an exception): its own event kind.
ERROR_EVENT = "recovery_error"
# A round's decision counts (RoundResult fields, the dashboard's columns, in order) -> the event kind each writes
# (admin.filters.RecoveryDecisionFilter and the dashboard's links read it).
COUNT_EVENTS = {
    "redispatched": EVENT_KINDS[decisions.REDISPATCH],
    "left_alone": EVENT_KINDS[decisions.LEAVE_ALONE],
    "unknown": EVENT_KINDS[decisions.OUTCOME_UNKNOWN],
    "failed": EVENT_KINDS[decisions.FAIL],
    "errors": ERROR_EVENT,
}
