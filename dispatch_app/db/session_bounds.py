"""Our long-running commands bound their own PostgreSQL sessions, whatever the project's settings leave unbounded.

This repository's settings give every session a statement, lock and idle-in-transaction timeout and a connect
timeout (productflow/settings.py). A project that installs the app and copies the README's ``DATABASES`` block
gives none, and then a dispatcher, worker or recovery loop could wait forever: for a lock another client holds, for
a connect to a host that drops packets, or hold its own locks forever from a transaction a hung thread left open.

So ``rundispatcher``, ``runworkers`` and ``recover`` call ``bound_sessions()`` before their first statement: the
connect timeout goes into the connection's options unless set there, and each new session (and the one open now)
gets every bound that is still 0 after the settings and the server (role, database, postgresql.conf) had their say,
in one statement per session. A bound named in ``OPTIONS["options"]`` is the project's choice and is kept, even 0.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.signals import connection_created

from dispatch_app.config.tuning import SESSION_BOUNDS_MS, SESSION_CONNECT_TIMEOUT

DISPATCH_UID = "dispatch_app.session_bounds"


def bound_sessions(alias: str = DEFAULT_DB_ALIAS) -> dict[str, int]:
    """Bound this process's sessions on ``alias`` from now on; returns the bounds it will fill in where unset."""
    options = connections.settings[alias].setdefault("OPTIONS", {})
    options.setdefault("connect_timeout", SESSION_CONNECT_TIMEOUT)
    chosen = str(options.get("options", ""))
    bounds = {name: ms for name, ms in SESSION_BOUNDS_MS.items() if name not in chosen}
    connection_created.disconnect(dispatch_uid=DISPATCH_UID)
    if not bounds:
        return bounds

    def on_connect(sender, connection, **kwargs) -> None:
        if connection.alias == alias:
            apply(connection, bounds)

    connection_created.connect(on_connect, weak=False, dispatch_uid=DISPATCH_UID)
    if connections[alias].connection is not None:  # opened before (this thread's checks): bounded too
        apply(connections[alias], bounds)
    return bounds


def unbound_sessions() -> None:
    """Stop bounding new sessions (tests)."""
    connection_created.disconnect(dispatch_uid=DISPATCH_UID)


def apply(connection, bounds: dict[str, int]) -> None:
    """Set each of ``bounds`` (ms) that reads 0 in this session, for the session (a new one is in autocommit)."""
    fill = ", ".join(
        "set_config(%s, CASE WHEN current_setting(%s) = '0' THEN %s ELSE current_setting(%s) END, false)"
        for _ in bounds
    )
    params = []
    for name, ms in bounds.items():
        params += [name, name, f"{ms}ms", name]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {fill}", params)
