"""The statements every job runs, as server-side prepared statements on Django's own connection.

Django's psycopg cursor binds parameters on the client, so PostgreSQL parses
and plans every statement anew. For the claim that planning was most of its
cost: 1.2 ms of backend CPU per (empty) claim, 0.7 ms of it planning, 0.19 ms
prepared (docs/benchmarks.md 2b, "This session"). ``cursor()``
hands out Django's cursor wrapper (error translation, query logging, execute
wrappers: everything a Django cursor does) around a server-binding psycopg
cursor that prepares what it executes: PostgreSQL plans a statement per
session, and after five executions keeps the generic plan when it costs no
more than the custom ones (plan_cache_mode = auto).

Only what asks for it is prepared: the connection's own automatic preparation
stays as configured (Django: off). With query logging on (DEBUG, a test
capturing queries) these statements run on Django's own cursor, so the log shows
them. ``DISPATCH["PREPARED_STATEMENTS"] = False`` turns this off, for PgBouncer
in transaction mode before 1.21 (prepared statements are per server session there).
"""

from __future__ import annotations

import psycopg
from django.conf import settings
from django.db import connection

from dispatch_app.config.settings import SPECS

# psycopg prepares nothing on a connection whose prepare_threshold is None (Django's default), not even on
# request; a threshold no statement reaches keeps automatic preparation off and honours prepare=True.
NEVER_AUTOMATICALLY = 2**31 - 1


class _PreparingCursor(psycopg.Cursor):
    def execute(self, query, params=None, *, prepare=None, binary=None):
        return super().execute(query, params, prepare=True, binary=binary)


def enabled() -> bool:
    # Read per call (override_settings works) without validating every setting on the hot path: the app's
    # system check validated DISPATCH at start-up.
    return (getattr(settings, "DISPATCH", None) or {}).get("PREPARED_STATEMENTS", SPECS["PREPARED_STATEMENTS"].default)


# The dispatcher's own sessions (claim and mark; they run nothing else). force_generic_plan: the mark's
# `id = ANY(ids)` looks dearer generic than for the one or two ids of a quiet drain, so PostgreSQL would
# otherwise plan it anew every time (0.4 of its 0.6 ms). enable_bitmapscan off: with few re-dispatches due,
# the planner may read them by bitmap and Sort, and a generic plan made then would be kept for a storm of
# thousands; without bitmaps both claim halves read their index in order (tests/integration/store/test_claim_plan.py).
DISPATCHER_SESSION = ("SET plan_cache_mode = force_generic_plan", "SET enable_bitmapscan = off")


def cursor(*, dispatcher_session: bool = False):
    """A cursor for the per-job statements (use it as ``with prepared.cursor() as cursor``).

    ``dispatcher_session``: this connection is the dispatcher's (DISPATCHER_SESSION is applied once).
    """
    if not enabled() or connection.queries_logged:
        # Query logging (DEBUG, a test capturing queries) shows Django's own cursor's statements with their
        # parameters; a server-binding cursor's would be logged without them.
        return connection.cursor()
    # What Django's connection.cursor() does (BaseDatabaseWrapper._cursor), with our cursor class.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    with connection.wrap_database_errors:
        if raw.prepare_threshold is None:
            raw.prepare_threshold = NEVER_AUTOMATICALLY
        if dispatcher_session and not getattr(raw, "_pf_dispatcher_session", False):
            for statement in DISPATCHER_SESSION:
                raw.execute(statement)
            raw._pf_dispatcher_session = True
        return connection._prepare_cursor(_PreparingCursor(raw))
